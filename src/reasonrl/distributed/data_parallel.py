"""Data-parallel training with torch.distributed: the same Learner on every rank, each rank
computing the gradient of its share of every mini-batch, the shares' gradients summed.

Every rank is handed the same global TrainBatch (built once and sent with `broadcast_batch`,
or built identically everywhere). Each optimizer step's sequences are dealt out by length
(rank r takes the r-th, (r + W)-th, ... shortest), so ranks do similar work, and every rank
normalises its micro-batch losses by the token and sequence counts of the whole mini-batch,
across all ranks (the aggregation functions take those counts as arguments for this reason,
see algo/aggregation.py). The sum over ranks of their gradients is then the gradient of the
whole mini-batch, so an update does not depend on the world size (up to the order of float
sums): the invariance "world size 1 == 2" of DESIGN.md section 4. Gradients are summed, not
averaged, in one all-reduce per optimizer step before clipping, so the clip sees the global
norm and every rank takes the same step.

With `shard=True` the parameters, gradients and optimizer state are sharded over the ranks with
FSDP2 (`torch.distributed.fsdp.fully_shard`, one unit per decoder layer plus one for the rest):
each rank holds 1/W of them and gathers a layer's weights only while it computes with it, so a
model W times larger than one rank's memory still trains. The gradients are summed (not
averaged) by FSDP's reduce-scatter, so the same global normalisation holds. FSDP's collectives
run inside every forward and backward, so every rank must run as many of them as the others:
a rank dealt fewer micro-batches runs idle passes (a forward and a zero backward) to match.

Why not DistributedDataParallel: DDP hooks the module's forward, which the learner bypasses
(it runs the decoder and the LM head separately, to skip the head at prompt positions), and
it averages gradients, which would need every loss rescaled by the world size.

Limits: an objective that draws random numbers itself (it takes a torch.Generator) draws them per
micro-batch, so its draws differ between world sizes. A token selection over the optimizer step
(Clip-Cov, KL-Cov) is made from the gathered log-probs of the whole step, with the same generator on
every rank, so it does not depend on the world size.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict, set_optimizer_state_dict
from torch.distributed.fsdp import FSDPModule, fully_shard

from reasonrl.training.learner import Accumulated, Learner, OptimConfig
from reasonrl.training.packing import attention_for
from reasonrl.training.token_stats import LossPositionStats
from reasonrl.types import TrainBatch

# One all-reduce per this many gradient elements (float32: 128 MiB): a flat buffer per call
# amortises the per-call latency without doubling the memory of a large model at once.
BUCKET_ELEMENTS = 1 << 25


def default_backend(device: torch.device | str) -> str:
    """nccl between GPUs, gloo between CPU processes."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_from_env(device: torch.device | str = "cpu") -> None:
    """Join the process group described by torchrun's environment (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT), with the backend the device needs; a no-op if already joined."""
    if dist.is_initialized():
        return
    missing = [name for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise RuntimeError(f"data-parallel training needs the environment variables {missing}: "
                           "launch with `torchrun --nproc-per-node=K ...` (or set them yourself)")
    dist.init_process_group(default_backend(device))


def rank_share(batch: TrainBatch, index_N: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank `rank`'s sequences among `index_N` when `world_size` ranks share them: every W-th by
    length, starting at the rank-th (every rank gets as many tokens as it can)."""
    if len(index_N) < world_size:
        # Every rank sees the same index_N, so every rank raises here: nobody waits in a collective.
        raise ValueError(f"an optimizer step over {len(index_N)} sequences cannot be shared by "
                         f"{world_size} ranks: use fewer train.mini_batches or more sequences per step")
    lengths_N = batch.attention_mask_NT[index_N].sum(1)
    return index_N[torch.argsort(lengths_N, stable=True)][rank::world_size]


class DataParallelLearner(Learner):
    """A Learner whose updates are shared by the ranks of a torch.distributed process group.

    Call `update` / `optimize` on every rank with the same global batch and arguments. The
    weights are broadcast from the group's rank 0 at construction, so every rank starts equal;
    equal gradients then keep them equal. `step` (losses that do not split into sequences)
    sums the ranks' gradients as they are: the caller normalises each rank's loss globally.

    It fills the learner's data-parallel seams: `share` deals each rank its sequences of an
    optimizer step, `combine` adds up the ranks' losses and metrics, `reduce_gradients` sums the
    gradients before clipping; `per_token` computes no-grad values the same way.
    """

    def __init__(self, model: Any, optim: OptimConfig, *, group: dist.ProcessGroup | None = None,
                 shard: bool = False, **kwargs: Any):
        if not dist.is_initialized():
            raise RuntimeError("DataParallelLearner needs a torch.distributed process group: call "
                               "torch.distributed.init_process_group (or init_from_env) first")
        if shard and optim.state != "float32":
            raise ValueError(f"FSDP sharding (run.learner_shard) shards AdamW's float32 state; optimizer state "
                             f"{optim.state!r} (bitsandbytes) does not take sharded weights")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        with torch.no_grad():
            for tensor in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(tensor, group=group, group_src=0)
        self.sharded = shard
        super().__init__(fully_sharded(model, group) if shard else model, optim, **kwargs)

    def share(self, batch: TrainBatch, index_N: torch.Tensor, rank: int | None = None) -> torch.Tensor:
        """A rank's sequences among `index_N` (this rank's by default): `rank_share`."""
        return rank_share(batch, index_N, self.rank if rank is None else rank, self.world_size)

    def per_token(self, model: Any, batch: TrainBatch, micro_batch_size: int,
                  forward: Callable[[Any, TrainBatch], torch.Tensor],
                  parts: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """Each rank computes its share of each part's rows, in the micro-batches its optimizer
        steps use; the rows are gathered by a sum (the other ranks' rows are zero on each rank)."""
        parts = [torch.arange(batch.num_sequences)] if parts is None else parts
        out_NT = super().per_token(model, batch, micro_batch_size, forward, [self.share(batch, part) for part in parts])
        if model is self.model:
            for part in parts:
                self._idle_passes(batch, part, micro_batch_size, backward=False)
        return self._all_reduce(out_NT)

    def combine(self, accumulated: Accumulated, batch: TrainBatch, index_N: torch.Tensor,
                micro_batch_size: int) -> Accumulated:
        """The loss and metric sums of every rank's share of `index_N`, added up (maxima: the
        largest), and on how many ranks the loss was not finite: every rank raises then, after
        the collectives, so none is left waiting in one."""
        self._idle_passes(batch, index_N, micro_batch_size, backward=True)
        keys, max_keys = sorted(accumulated.token_sums), sorted(accumulated.maxima)
        summed = self._all_reduce(torch.tensor([accumulated.loss, float(bool(accumulated.non_finite))]
                                               + [accumulated.token_sums[k] for k in keys], dtype=torch.float64))
        maxima = self._all_reduce(torch.tensor([accumulated.maxima[k] for k in max_keys], dtype=torch.float64),
                                  dist.ReduceOp.MAX)
        return Accumulated(loss=float(summed[0]), token_sums=dict(zip(keys, summed[2:].tolist())),
                           maxima=dict(zip(max_keys, maxima.tolist())),
                           non_finite=f"not finite on {int(summed[1])} rank(s)" if summed[1] > 0 else "")

    def _idle_passes(self, batch: TrainBatch, index_N: torch.Tensor, micro_batch_size: int, *, backward: bool) -> None:
        """With FSDP, as many forward (and zero backward) passes as this rank is short of the rank
        dealt the most micro-batches of `index_N`: the others wait for it in FSDP's collectives.
        Every rank counts every rank's micro-batches from the same batch, so nothing is sent."""
        if not self.sharded:
            return
        pack = self.packs(self.model)
        counts = [len(self.micro_batches(batch, self.share(batch, index_N, rank), micro_batch_size, pack))
                  for rank in range(self.world_size)]
        idle = batch.select(index_N[:1]).to(self.device)
        for _ in range(max(counts) - counts[self.rank]):
            with torch.set_grad_enabled(backward), self.autocast(), attention_for(self.model, idle.input_ids_NT.shape, pack):
                logp_K, _ = self.model(idle.input_ids_NT, idle.attention_mask_NT, idle.loss_mask_NT.bool())
                if backward:
                    (logp_K.sum() * 0.0).backward()

    def reduce_gradients(self) -> None:
        if not self.sharded:  # FSDP has summed them already (reduce-scatter)
            self.all_reduce_gradients()

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The trainable weights, whole (with FSDP gathered from every rank: call it on every rank)."""
        model = self.model.policy if self.sharded else self.model
        for name, param in model.named_parameters():
            if param.requires_grad:
                yield name, param.detach().full_tensor() if self.sharded else param.detach()

    def state_dict(self) -> dict[str, Any]:
        """With FSDP, the optimizer state gathered whole on rank 0 (call it on every rank; the
        other ranks get an empty optimizer state)."""
        if not self.sharded:
            return super().state_dict()
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return {"optimizer": get_optimizer_state_dict(self.model, self.optimizer, options=options),
                "scheduler": self.scheduler.state_dict(), "updates": self.updates, "fsdp": True}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not self.sharded:
            return super().load_state_dict(state)
        if not state.get("fsdp"):
            raise ValueError("this optimizer state was saved by an unsharded learner: resume with "
                             "run.learner_shard=false")
        if "optimizer" in state:  # absent from a checkpoint written with run.save_optimizer=false
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"],
                                     options=StateDictOptions(full_state_dict=True))
        self.scheduler.load_state_dict(state["scheduler"])
        self.updates = state["updates"]
        self.apply_optim_settings()

    def all_reduce_gradients(self) -> None:
        """Sum every trainable parameter's gradient over the ranks, in flat buckets."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:  # a rank whose share did not reach this weight still takes part
                p.grad = torch.zeros_like(p)
        for bucket in _buckets([p.grad for p in params], BUCKET_ELEMENTS):
            flat = self._all_reduce(torch.cat([g.reshape(-1) for g in bucket]))
            for grad, summed in zip(bucket, flat.split([g.numel() for g in bucket])):
                grad.copy_(summed.view_as(grad))

    def _all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM) -> torch.Tensor:
        """The elementwise sum (or `op`) over ranks, on the device the backend needs, back where it was."""
        if self.world_size == 1:
            return tensor
        where = tensor.device
        on_backend = tensor.to(self.device) if dist.get_backend(self.group) == "nccl" else tensor
        dist.all_reduce(on_backend, op=op, group=self.group)
        return on_backend.to(where)


def fully_sharded(policy: Any, group: dist.ProcessGroup | None = None) -> LossPositionStats:
    """The policy with FSDP2: a unit per decoder layer, and the root (embeddings, final norm, LM
    head, which may share the embeddings' weight) around the loss-position forward. Gradients
    are summed over the ranks, not averaged: the losses are normalised globally already."""
    if any(not param.requires_grad for param in policy.parameters()):
        raise ValueError("FSDP sharding (run.learner_shard) trains every weight: it does not support LoRA "
                         "or frozen weights; use the unsharded data-parallel learner")
    from torch.distributed.device_mesh import DeviceMesh

    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    device = next(policy.parameters()).device
    mesh = DeviceMesh.from_group(group or dist.group.WORLD, device.type, mesh=torch.tensor(ranks))
    layers = getattr(policy.get_decoder(), "layers", None)
    if layers is None:
        raise ValueError(f"FSDP sharding needs the decoder's layers at .layers; {type(policy).__name__} has none")
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    root = fully_shard(LossPositionStats(policy), mesh=mesh)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            # A sum: gloo has no pre-multiplied sum, and the loss is normalised globally already.
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return root


def _buckets(tensors: Sequence[torch.Tensor], max_elements: int) -> list[list[torch.Tensor]]:
    """Consecutive tensors of one dtype and device, at most `max_elements` per bucket (a larger
    tensor alone)."""
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for tensor in tensors:
        last = buckets[-1][-1] if buckets else None
        if (last is None or size + tensor.numel() > max_elements or tensor.dtype != last.dtype
                or tensor.device != last.device):
            buckets.append([])
            size = 0
        buckets[-1].append(tensor)
        size += tensor.numel()
    return buckets


def broadcast_batch(batch: TrainBatch | None, *, group: dist.ProcessGroup | None = None) -> TrainBatch:
    """The group's rank-0 batch on every rank (pass None on the other ranks)."""
    box = [batch]
    dist.broadcast_object_list(box, group=group, group_src=0)
    if box[0] is None:
        raise ValueError("broadcast_batch got no batch on rank 0")
    return box[0]
