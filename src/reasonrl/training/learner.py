"""The learner: the policy's trainable weights, its optimizer, and one update per rollout batch.

It is algorithm-blind: the trainer hands it a TrainBatch (tokens, loss mask, per-token advantages)
and a loss (reasonrl.algo.loss.PolicyLoss, which composes the objective, corrections, entropy bonus
and KL penalty and says what it needs: old or reference log-probs, the entropy's gradient); the
learner computes log-probs, applies the loss over epochs x mini-batches x micro-batches with
gradient accumulation, clips and steps.
The same loop (`Learner.optimize`) trains a critic's value model with its own loss. Weights stay
float32, and AdamW's state too unless `train.optimizer_state=8bit` (reasonrl.training.optimizers);
`autocast` runs the matmuls in bfloat16 where the hardware has it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from reasonrl.algo.loss import PolicyLoss
from reasonrl.seeds import derive_seed
from reasonrl.training.optimizers import adamw, check_same_optimizer_state
from reasonrl.training.packing import attention_for, micro_batches, packable
from reasonrl.training.runtime import keeps_freed_memory, release_freed_memory
from reasonrl.training.token_stats import token_logprobs
from reasonrl.types import Group, TrainBatch

RELEASE_AFTER_LONG_MICRO_BATCHES = True  # Learner.releases_memory_after; benchmarks/long_sequences turns it off


class NonFiniteLossError(RuntimeError):
    """The loss or gradient became NaN/inf; the weights were not updated."""


MicroBatchBackward = Callable[[TrainBatch, float, int, torch.Generator], tuple[float, dict[str, torch.Tensor]]]
"""(micro-batch, tokens of the whole mini-batch, its sequences, generator) -> (loss, per-token
metric means), having accumulated the micro-batch's gradient."""


def backward_finite(scalar: torch.Tensor) -> float:
    """Backpropagate `scalar` unless it is NaN/inf (the caller then refuses the step); its value."""
    value = scalar.item()
    if math.isfinite(value):
        scalar.backward()
    return value


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    warmup_steps: int = 0
    schedule: str = "constant"  # after the warm-up: constant, or linear / cosine decay to 0 at decay_horizon
    decay_horizon: int = 0  # optimizer steps of the whole run (train.steps x optimizer steps per step)
    state: str = "float32"  # how AdamW stores its moments: float32 or 8bit (reasonrl.training.optimizers)

    @classmethod
    def of(cls, train: Any, *, lr: float, weight_decay: float, updates_per_step: int | None = None) -> OptimConfig:
        """The settings of a run's `train` section at this learning rate and weight decay, the schedule's
        decay spread over the run's optimizer steps (train.steps of `updates_per_step` each; by default
        an RL step's, ppo_epochs x mini_batches)."""
        if updates_per_step is None:
            updates_per_step = train.ppo_epochs * train.mini_batches
        return cls(lr=lr, betas=(train.beta1, train.beta2), weight_decay=weight_decay, grad_clip=train.grad_clip,
                   warmup_steps=train.warmup_steps, schedule=train.lr_schedule,
                   decay_horizon=train.steps * updates_per_step, state=train.optimizer_state)


def lr_factor(optim: OptimConfig) -> Callable[[int], float]:
    """The learning rate's multiplier before optimizer step `s` (0-based): a linear warm-up over
    warmup_steps, then constant, or decaying to 0 at decay_horizon, linearly or along half a cosine
    (the schedules of transformers' get_linear/cosine_schedule_with_warmup). A plain function, not a
    callable object, so that LambdaLR does not checkpoint it: a resume takes the schedule of its own
    settings from the restored position."""
    warmup, horizon, schedule = optim.warmup_steps, optim.decay_horizon, optim.schedule
    if schedule not in ("constant", "linear", "cosine"):
        raise ValueError(f"unknown learning-rate schedule {schedule!r}: constant, linear or cosine")

    def factor(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (s - warmup) / max(1, horizon - warmup))
        return 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def make_train_batch(groups: Sequence[Group], advantages: Sequence[float], pad_id: int) -> TrainBatch:
    """Prompt + completion of every sample, right-padded; the loss mask covers the completion
    tokens the policy generated, and each sample's advantage is repeated over them. The batch's
    generation budget is the groups' (the largest, if they differ)."""
    sequences, prompt_lengths, sampling_logps, generated_masks = [], [], [], []
    for group in groups:
        for completion in group.completions:
            sequences.append(list(group.prompt_ids) + list(completion.token_ids))
            prompt_lengths.append(len(group.prompt_ids))
            sampling_logps.append(completion.logprobs)
            generated_masks.append(completion.loss_mask)
    if len(advantages) != len(sequences):
        raise ValueError(f"{len(advantages)} advantages for {len(sequences)} sequences")
    width = max(len(s) for s in sequences)
    n = len(sequences)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width - 1))
    sampling_logp = torch.zeros((n, width - 1))
    for i, (seq, prompt_len, logps, generated) in enumerate(zip(sequences, prompt_lengths, sampling_logps,
                                                                generated_masks)):
        input_ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        # Position t predicts token t + 1: completion tokens are predicted from prompt_len - 1 on.
        loss_mask[i, prompt_len - 1 : len(seq) - 1] = 1 if generated is None else torch.tensor(generated)
        sampling_logp[i, prompt_len - 1 : len(seq) - 1] = torch.tensor(logps)
    advantages_NT = torch.tensor(advantages, dtype=torch.float32)[:, None] * loss_mask
    budgets = [group.max_new_tokens for group in groups if group.max_new_tokens is not None]
    return TrainBatch(input_ids_NT=input_ids, attention_mask_NT=attention, loss_mask_NT=loss_mask,
                      sampling_logp_NT=sampling_logp, advantages_NT=advantages_NT,
                      max_new_tokens=max(budgets) if budgets else None)


@dataclass
class Accumulated:
    """What accumulating an optimizer step's gradient measured over its micro-batches: the loss
    (each micro-batch's normalised over the whole step), per-token metrics summed with their
    micro-batch's token count as weight (maxima for keys ending in `_max`), and how the loss was
    not finite ("" when it was)."""

    loss: float = 0.0
    token_sums: dict[str, float] = field(default_factory=dict)
    maxima: dict[str, float] = field(default_factory=dict)
    non_finite: str = ""

    def add(self, scalar: float, per_token: Mapping[str, Any], tokens: float) -> None:
        """One micro-batch's loss and per-token metric means over its `tokens` loss tokens."""
        if math.isfinite(scalar):
            self.loss += scalar
        else:
            self.non_finite = self.non_finite or str(scalar)
        for key, value in per_token.items():
            if key.endswith("_max"):
                self.maxima[key] = max(self.maxima.get(key, -math.inf), float(value))
            else:
                self.token_sums[key] = self.token_sums.get(key, 0.0) + float(value) * tokens

    def means(self, total_tokens: float) -> dict[str, float]:
        """The per-token metric means over `total_tokens`, and the maxima."""
        return {key: value / max(total_tokens, 1.0) for key, value in self.token_sums.items()} | self.maxima


class Scorer:
    """A model's no-grad log-probs (or other per-token values) over a batch, cut into the micro-batches
    an optimizer step over it uses: what a learner computes before it trains, and all a process that
    holds the policy without training it computes (the driver of data-parallel learner ranks)."""

    def __init__(self, model: Any, *, temperature: float = 1.0, autocast_dtype: torch.dtype | None = None,
                 seed: int = 0, pack: bool = False, micro_batch_positions: int = 0):
        self.model = model
        # Packed micro-batches (reasonrl.training.packing) need a forward that reads the packed row:
        # LossPositionStats for a policy, critic.token_values for a value model.
        self.pack = pack
        self.micro_batch_positions = micro_batch_positions
        self.temperature = temperature if temperature > 0 else 1.0
        self.device = next(model.parameters()).device
        self.autocast_dtype = autocast_dtype
        self.seed = seed

    def autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def releases_memory_after(self, micro: TrainBatch) -> bool:
        """Whether the memory `micro` freed goes back to the system after its backward: on a CPU whose
        allocator keeps freed memory (run.keep_freed_memory), after a micro-batch longer than
        micro_batch_positions (one sequence too long to share a packed micro-batch; a micro-batch of
        several short ones, whose padded N x T may well exceed it, keeps its memory). Its activations are then not left as holes in the
        heap that the next micro-batch's differently sized tensors cannot reuse: on 2 x 4096 tokens
        the peak RSS was 6.04 GiB against 6.38 GiB with the memory kept, and the update no slower (63 s
        against 70 s; benchmarks/results/long_sequences_trim.json). Refaulting the pages costs little
        beside such a micro-batch's arithmetic. Short micro-batches keep it all: that is what makes
        them fast."""
        return (RELEASE_AFTER_LONG_MICRO_BATCHES and self.device.type == "cpu" and self.micro_batch_positions > 0
                and int(micro.attention_mask_NT.sum(dim=1).max()) > self.micro_batch_positions
                and keeps_freed_memory())

    def packs(self, model: Any) -> bool:
        """Whether micro-batches of `model` (the policy, or the reference) run packed."""
        return self.pack and packable(model)

    def micro_batches(self, batch: TrainBatch, index_N: torch.Tensor, micro_batch_size: int,
                      pack: bool) -> list[torch.Tensor]:
        """The micro-batches of `index_N`: packed ones filled up to `micro_batch_positions` when set."""
        return micro_batches(batch, index_N, micro_batch_size, pack, self.micro_batch_positions)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The trainable weights, to sync to rollout engines: every weight in full fine-tuning,
        only the adapters with LoRA (the engine holds the same frozen base)."""
        for name, param in self.model.named_parameters():
            if param.requires_grad:
                yield name, param.detach()

    def logprobs(self, model: Any, batch: TrainBatch, micro_batch_size: int,
                 parts: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """No-grad log-probs of the batch under `model` (policy or reference), (N, T-1): of the
        sequences of `parts` (default: all), each part cut into the micro-batches an optimizer
        step over it uses, so that they equal the update's own log-probs bit for bit (under bf16,
        another packing of the same sequences gives log-probs ~0.02 nats apart)."""
        return self.per_token(model, batch, micro_batch_size,
                              lambda model, micro: token_logprobs(model, micro, self.temperature)[0], parts)

    def per_token(self, model: Any, batch: TrainBatch, micro_batch_size: int,
                  forward: Callable[[Any, TrainBatch], torch.Tensor],
                  parts: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """`forward(model, micro_batch)` without gradient over the sequences of `parts` (default:
        all), in the micro-batches an optimizer step over each part uses, gathered into one
        (N, T-1) tensor on the CPU (zero in rows outside the parts)."""
        out = torch.zeros_like(batch.loss_mask_NT)
        pack = self.packs(model)
        with torch.no_grad(), self.autocast():
            for part in [torch.arange(batch.num_sequences)] if parts is None else parts:
                for index in self.micro_batches(batch, part, micro_batch_size, pack):
                    micro = batch.select(index)
                    with attention_for(model, micro.input_ids_NT.shape, pack):
                        values_NT = forward(model, micro.to(self.device))
                    out[index, : micro.loss_mask_NT.shape[1]] = values_NT.cpu()
        return out

    def close(self) -> None:
        """Nothing to release: the model and its optimizer live in this process."""

    def mini_batch_split(self, num_sequences: int, mini_batches: int, step: int) -> list[torch.Tensor]:
        """The sequences of each optimizer step of the update at `step`: a random partition into
        `mini_batches` parts (in order when there is one), the same parts in every epoch, so
        that every sequence is trained in the micro-batch its old log-prob was computed in."""
        if mini_batches == 1:
            return [torch.arange(num_sequences)]
        generator = torch.Generator().manual_seed(derive_seed(self.seed, step, "mini_batches"))
        return list(torch.randperm(num_sequences, generator=generator).tensor_split(mini_batches))

    def with_reference(self, batch: TrainBatch, loss: PolicyLoss, ref_model: Any, *, micro_batch_size: int,
                       mini_batches: int = 1, step: int = 0) -> TrainBatch:
        """The batch with the reference's log-probs when `loss` needs them and it has none, taken in
        the micro-batches of the update at `step` (its `mini_batch_split`): the one place they are
        filled, for a learner here and for learner ranks elsewhere alike."""
        if batch.ref_logp_NT is not None or not loss.needs_reference:
            return batch
        if ref_model is None:
            raise ValueError("a KL penalty in the loss needs the reference model")
        parts = self.mini_batch_split(batch.num_sequences, mini_batches, step)
        return replace(batch, ref_logp_NT=self.logprobs(ref_model, batch, micro_batch_size, parts))


class Learner(Scorer):
    """Owns a trainable model (the policy, or a critic's value model) and its optimizer."""

    def __init__(self, model: Any, optim: OptimConfig, *, temperature: float = 1.0,
                 autocast_dtype: torch.dtype | None = None, seed: int = 0, pack: bool = False,
                 micro_batch_positions: int = 0):
        super().__init__(model, temperature=temperature, autocast_dtype=autocast_dtype, seed=seed, pack=pack,
                         micro_batch_positions=micro_batch_positions)
        self.grad_clip = optim.grad_clip
        self.optimizer = adamw([p for p in model.parameters() if p.requires_grad], lr=optim.lr, betas=optim.betas,
                               weight_decay=optim.weight_decay, state=optim.state, device=self.device)
        self.optim = optim
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor(optim))
        self.updates = 0
        self.optimizer_steps: list[dict[str, float]] = []  # the last update's, a record per optimizer step

    def update(self, batch: TrainBatch, loss: PolicyLoss, *, epochs: int = 1, mini_batches: int = 1,
               micro_batch_size: int = 8, ref_model: Any = None, step: int = 0,
               auxiliary: tuple[TrainBatch, PolicyLoss] | None = None) -> dict[str, float]:
        """Optimise `loss` on `batch`: `epochs` passes, each split into `mini_batches` optimizer
        steps, each accumulated over micro-batches of `micro_batch_size` sequences. An `auxiliary`
        (batch, loss), e.g. a supervised loss on expert solutions, adds its whole gradient to every
        optimizer step (normalised over its own tokens); its loss is logged as `loss/auxiliary`.

        The old log-probs (of the policy before the update) are computed here, in the very
        micro-batches the optimizer steps use, so the importance ratio is exactly 1 until the
        weights change. Strictly on-policy (one optimizer step) none are needed: the ratio is
        exp(logp - logp.detach())."""
        self.model.train()
        on_policy = epochs == 1 and mini_batches == 1 and not loss.needs_old_logp
        parts = self.mini_batch_split(batch.num_sequences, mini_batches, step)
        old_is_current = batch.old_logp_NT is None  # until the first optimizer step
        if batch.old_logp_NT is None and not on_policy:
            batch = replace(batch, old_logp_NT=self.logprobs(self.model, batch, micro_batch_size, parts))
        batch = self.with_reference(batch, loss, ref_model, micro_batch_size=micro_batch_size,
                                    mini_batches=mini_batches, step=step)
        batch, masked = loss.mask_mismatched(batch)

        def backward(micro: TrainBatch, total_tokens: float, total_sequences: int, generator: torch.Generator):
            return self._backward(micro, loss, total_tokens, total_sequences, generator)

        prepare = None
        if loss.token_selection is not None:
            def prepare(batch: TrainBatch, mini: torch.Tensor, generator: torch.Generator, first: bool) -> TrainBatch:
                return self._with_token_selection(batch, mini, loss, micro_batch_size, generator,
                                                  fresh=first and old_is_current)

        add_auxiliary = None
        if auxiliary is not None:
            auxiliary_batch, auxiliary_loss = auxiliary

            def auxiliary_backward(micro: TrainBatch, total_tokens: float, total_sequences: int,
                                   generator: torch.Generator):
                return self._backward(micro, auxiliary_loss, total_tokens, total_sequences, generator)

            def add_auxiliary(generator: torch.Generator) -> dict[str, float]:
                index = torch.arange(auxiliary_batch.num_sequences)
                total, _ = self._accumulate(auxiliary_batch, index, auxiliary_backward, micro_batch_size, generator)
                return {"loss/auxiliary": total}

        return masked | self.optimize(batch, backward, epochs=epochs, mini_batches=mini_batches,
                                      micro_batch_size=micro_batch_size, step=step, also=add_auxiliary,
                                      prepare=prepare)

    def _with_token_selection(self, batch: TrainBatch, mini: torch.Tensor, loss: PolicyLoss, micro_batch_size: int,
                              generator: torch.Generator, fresh: bool) -> TrainBatch:
        """The batch with the loss's token selection over the optimizer step `mini`, from the current
        log-probs: the old ones while the weights are unchanged (`fresh`), else a no-grad pass over
        the step's micro-batches."""
        current_NT = batch.old_logp_NT if fresh else self.logprobs(self.model, batch, micro_batch_size, [mini])
        return loss.select_tokens(current_NT, batch, mini, generator)

    def optimize(self, batch: TrainBatch, backward: MicroBatchBackward, *, epochs: int = 1, mini_batches: int = 1,
                 micro_batch_size: int = 8, step: int = 0, loss_key: str = "loss/policy",
                 prefix: str = "train", also: Callable[[torch.Generator], dict[str, float]] | None = None,
                 prepare: Callable[[TrainBatch, torch.Tensor, torch.Generator, bool], TrainBatch] | None = None,
                 ) -> dict[str, float]:
        """`epochs` passes over `batch`, each split into the `mini_batches` optimizer steps of
        `mini_batch_split` (visited in a fresh order after the first epoch), each accumulated over
        micro-batches by `backward` (and `also`, which accumulates more gradient before each
        step; `prepare` may first add what the step's micro-batches need to the batch). The
        metrics of every optimizer step are kept in `optimizer_steps`; the returned ones are
        their means (maxima for keys ending in `_max`)."""
        parts = self.mini_batch_split(batch.num_sequences, mini_batches, step)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        self.optimizer_steps = []
        for epoch in range(epochs):
            order = range(len(parts)) if epoch == 0 else torch.randperm(len(parts), generator=generator).tolist()
            for k in order:
                stepped = batch if prepare is None else prepare(batch, parts[k], generator, not self.optimizer_steps)
                metrics = self._optimizer_step(stepped, parts[k], backward, micro_batch_size, generator, loss_key,
                                               prefix, also)
                self.optimizer_steps.append(metrics)
        return summarize_steps(self.optimizer_steps)

    def _optimizer_step(self, batch: TrainBatch, mini: torch.Tensor, backward: MicroBatchBackward,
                        micro_batch_size: int, generator: torch.Generator, loss_key: str, prefix: str,
                        also: Callable[[torch.Generator], dict[str, float]] | None = None) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        total_loss, metrics = self._accumulate(batch, mini, backward, micro_batch_size, generator)
        metrics[loss_key] = total_loss
        if also is not None:
            metrics |= also(generator)
        return metrics | self._apply_gradients(prefix)

    def _accumulate(self, batch: TrainBatch, index_N: torch.Tensor, backward: MicroBatchBackward,
                    micro_batch_size: int, generator: torch.Generator) -> tuple[float, dict[str, float]]:
        """Accumulate the gradient of this process's `share` of the sequences at `index_N`, micro-batch
        by micro-batch, each normalised over all of them; the loss and per-token metric means of all
        of them (what every process accumulated, `combine`d)."""
        total_tokens = float(batch.loss_mask_NT[index_N].sum())
        # A sequence with no token left in the loss (all masked) leaves the per-sequence normalisers too.
        total_sequences = int((batch.loss_mask_NT[index_N].sum(dim=1) > 0).sum())
        accumulated = Accumulated()
        pack = self.packs(self.model)
        for index in self.micro_batches(batch, self.share(batch, index_N), micro_batch_size, pack):
            micro = batch.select(index).to(self.device)
            # Until after backward: activation checkpointing recomputes with the same attention.
            with attention_for(self.model, micro.input_ids_NT.shape, pack):
                scalar, per_token = backward(micro, total_tokens, total_sequences, generator)
            accumulated.add(scalar, per_token, float(micro.loss_mask_NT.sum()))
            if self.releases_memory_after(micro):
                release_freed_memory()
        accumulated = self.combine(accumulated, batch, index_N, micro_batch_size)
        if accumulated.non_finite:
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(f"the loss is {accumulated.non_finite} at update {self.updates}; weights left "
                                     "unchanged. Lower train.lr, check the rewards for NaN/inf, or use train.dtype=float32")
        return accumulated.loss, accumulated.means(total_tokens)

    # How an optimizer step is shared between processes. This learner is one process doing all of
    # it; a data-parallel learner (reasonrl.distributed.data_parallel) deals each process a share
    # of the sequences and adds up what they measured and their gradients.

    def share(self, batch: TrainBatch, index_N: torch.Tensor) -> torch.Tensor:
        """This process's sequences among `index_N`: all of them."""
        return index_N

    def combine(self, accumulated: Accumulated, batch: TrainBatch, index_N: torch.Tensor,
                micro_batch_size: int) -> Accumulated:
        """What every process accumulated over its share of `index_N`, added up: this process's."""
        return accumulated

    def reduce_gradients(self) -> None:
        """Sum the accumulated gradients of the processes before clipping: one process, nothing to do."""

    def step(self, loss_fn: Callable[[], tuple[torch.Tensor, dict[str, float]]], *, prefix: str = "train",
             ) -> dict[str, float]:
        """One optimizer step on the scalar `loss_fn()` returns (computed under autocast), for losses
        that do not decompose over micro-batches of sequences (e.g. DPO's pairs); its metrics."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            scalar, metrics = loss_fn()
        if not math.isfinite(backward_finite(scalar)):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(f"the loss is {scalar.item()} at update {self.updates}; weights left unchanged")
        return {**metrics, **self._apply_gradients(prefix)}

    def _apply_gradients(self, prefix: str) -> dict[str, float]:
        """Clip the accumulated gradient (summed over the processes), step the optimizer and the
        schedule; grad norm and lr."""
        self.reduce_gradients()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip if self.grad_clip > 0 else math.inf)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor, when FSDP2 shards the parameters
            grad_norm = grad_norm.full_tensor()
        if not torch.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(f"the gradient norm is {grad_norm.item()} at update {self.updates}; "
                                     "weights left unchanged")
        lr = self.optimizer.param_groups[0]["lr"]  # the one this step applies (the schedule moves on after it)
        self.optimizer.step()
        self.scheduler.step()
        self.updates += 1
        return {f"{prefix}/grad_norm": grad_norm.item(), f"{prefix}/lr": lr}

    def _backward(self, micro: TrainBatch, loss: PolicyLoss, total_tokens: float, total_sequences: int,
                  generator: torch.Generator) -> tuple[float, dict[str, torch.Tensor]]:
        """Accumulate one micro-batch's gradient of `loss`; its loss and per-token metric means."""
        with self.autocast():
            logp_NT, entropy_NT = token_logprobs(self.model, micro, self.temperature, with_entropy=True,
                                                 entropy_grad=loss.entropy_grad)
        loss_NT, per_token = loss.token_losses(logp_NT, entropy_NT, micro, generator)
        scalar = loss.aggregate(loss_NT, micro, total_tokens=total_tokens, total_sequences=total_sequences)
        return backward_finite(scalar), per_token

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "updates": self.updates, "optimizer_state": self.optim.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("fsdp"):
            raise ValueError("this optimizer state was saved by FSDP-sharded learner ranks (keyed by weight name): "
                             "resume with run.learner_workers > 0 and run.learner_shard=true")
        if "optimizer" in state:  # absent from a checkpoint written with run.save_optimizer=false
            check_same_optimizer_state(state, self.optim.state)
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.updates = state["updates"]
        self.apply_optim_settings()

    def apply_optim_settings(self) -> None:
        """This learner's learning rate, schedule, betas and weight decay over those of a restored
        optimizer state (which carries the settings it was saved with): a resume that changes them
        trains with them, from the schedule's restored position."""
        self.scheduler.base_lrs = [self.optim.lr] * len(self.optimizer.param_groups)
        for group, factor in zip(self.optimizer.param_groups, self.scheduler.lr_lambdas):
            group.update(initial_lr=self.optim.lr, lr=self.optim.lr * factor(self.scheduler.last_epoch),
                         betas=self.optim.betas, weight_decay=self.optim.weight_decay)


def summarize_steps(steps: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The metrics of an update's optimizer steps as one record: means, and maxima for `_max` keys."""
    summary: dict[str, float] = {}
    for key in dict.fromkeys(key for metrics in steps for key in metrics):
        values = [metrics[key] for metrics in steps if key in metrics]
        summary[key] = max(values) if key.endswith("_max") else sum(values) / len(values)
    return summary
