"""The learner: the policy's trainable weights, its optimizer, and one update per rollout batch.

It is algorithm-blind: the trainer hands it a `PolicyLoss` (the objective, aggregation and KL
functions chosen by name in the config) and a TrainBatch (tokens, loss mask, advantages); the
learner computes log-probs, applies the loss over epochs x mini-batches x micro-batches with
gradient accumulation, clips and steps. Weights and optimizer state stay float32; `autocast`
runs the matmuls in bfloat16 where the hardware has it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from reasonrl.algo.objectives import masked_mean
from reasonrl.types import Group, TrainBatch


class NonFiniteLossError(RuntimeError):
    """The loss or gradient became NaN/inf; the weights were not updated."""


@dataclass(frozen=True)
class PolicyLoss:
    """What to minimise, as functions from reasonrl.algo with their hyper-parameters."""

    objective: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
    aggregation: Callable[..., torch.Tensor]
    objective_kwargs: Mapping[str, Any] = field(default_factory=dict)
    kl_estimator: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    kl_coef: float = 0.0


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    warmup_steps: int = 0


def make_train_batch(groups: Sequence[Group], advantages: Sequence[float], pad_id: int) -> TrainBatch:
    """Prompt + completion of every sample, right-padded; the loss mask covers completion tokens."""
    sequences, prompt_lengths, sampling_logps = [], [], []
    for group in groups:
        for completion in group.completions:
            sequences.append(list(group.prompt_ids) + list(completion.token_ids))
            prompt_lengths.append(len(group.prompt_ids))
            sampling_logps.append(completion.logprobs)
    if len(advantages) != len(sequences):
        raise ValueError(f"{len(advantages)} advantages for {len(sequences)} sequences")
    width = max(len(s) for s in sequences)
    n = len(sequences)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width - 1))
    sampling_logp = torch.zeros((n, width - 1))
    for i, (seq, prompt_len, logps) in enumerate(zip(sequences, prompt_lengths, sampling_logps)):
        input_ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        # Position t predicts token t + 1: completion tokens are predicted from prompt_len - 1 on.
        loss_mask[i, prompt_len - 1 : len(seq) - 1] = 1
        sampling_logp[i, prompt_len - 1 : len(seq) - 1] = torch.tensor(logps)
    return TrainBatch(input_ids_NT=input_ids, attention_mask_NT=attention, loss_mask_NT=loss_mask,
                      sampling_logp_NT=sampling_logp, advantages_N=torch.tensor(advantages, dtype=torch.float32))


def token_logprobs(model: Any, batch: TrainBatch, temperature: float,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(next token) from logits / temperature at the loss positions of the batch (zero
    elsewhere), (N, T-1); and the entropy of that distribution there when asked (no gradient).

    Only loss positions go through the LM head and the float32 softmax: prompt positions need
    neither, and with a 49k vocabulary the head and its softmax are a large share of the work.
    """
    attention = batch.attention_mask_NT
    hidden_NTH = model.get_decoder()(input_ids=batch.input_ids_NT, attention_mask=attention,
                                     position_ids=(attention.cumsum(1) - 1).clamp(min=0)).last_hidden_state
    where_NT = batch.loss_mask_NT.bool()
    logits_KV = model.get_output_embeddings()(hidden_NTH[:, :-1][where_NT]).float()
    softcap = getattr(model.config, "final_logit_softcapping", None)
    if softcap:
        logits_KV = torch.tanh(logits_KV / softcap) * softcap
    if temperature not in (0.0, 1.0):
        logits_KV = logits_KV / temperature
    logp_KV = torch.log_softmax(logits_KV, dim=-1)
    logp_K = logp_KV.gather(1, batch.input_ids_NT[:, 1:][where_NT][:, None]).squeeze(1)
    logp_NT = torch.zeros(where_NT.shape, dtype=logp_K.dtype, device=logp_K.device).masked_scatter(where_NT, logp_K)
    entropy_NT = None
    if with_entropy:
        with torch.no_grad():
            entropy_K = -(logp_KV.exp() * logp_KV).sum(-1)
            entropy_NT = torch.zeros_like(logp_NT).masked_scatter(where_NT, entropy_K)
    return logp_NT, entropy_NT


class Learner:
    """Owns the trainable policy and its optimizer."""

    def __init__(self, model: Any, optim: OptimConfig, *, temperature: float = 1.0,
                 autocast_dtype: torch.dtype | None = None, seed: int = 0):
        self.model = model
        self.temperature = temperature if temperature > 0 else 1.0
        self.device = next(model.parameters()).device
        self.autocast_dtype = autocast_dtype
        self.seed = seed
        self.grad_clip = optim.grad_clip
        # The fused kernel updates each tensor in one pass; the default per-tensor loop makes
        # several full-size temporaries per step (a third of a small model's update time on CPU).
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=optim.lr,
                                           betas=optim.betas, weight_decay=optim.weight_decay,
                                           fused=self.device.type in ("cpu", "cuda"))
        warmup = optim.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
        self.updates = 0

    def _autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The trainable weights, to sync to rollout engines: every weight in full fine-tuning,
        only the adapters with LoRA (the engine holds the same frozen base)."""
        for name, param in self.model.named_parameters():
            if param.requires_grad:
                yield name, param.detach()

    def logprobs(self, model: Any, batch: TrainBatch, micro_batch_size: int) -> torch.Tensor:
        """No-grad log-probs of the whole batch under `model` (policy or reference), (N, T-1)."""
        out = torch.zeros_like(batch.sampling_logp_NT)
        with torch.no_grad(), self._autocast():
            for index in micro_batches(batch, torch.arange(batch.num_sequences), micro_batch_size):
                micro = batch.select(index)
                with _attention_for(model, micro.input_ids_NT.shape):
                    logp_NT = token_logprobs(model, micro.to(self.device), self.temperature)[0]
                out[index, : micro.loss_mask_NT.shape[1]] = logp_NT.cpu()
        return out

    def update(self, batch: TrainBatch, loss: PolicyLoss, *, epochs: int = 1, mini_batches: int = 1,
               micro_batch_size: int = 8, ref_model: Any = None, step: int = 0) -> dict[str, float]:
        """Optimise `loss` on `batch`: `epochs` passes, each split into `mini_batches` optimizer
        steps, each accumulated over micro-batches of `micro_batch_size` sequences."""
        self.model.train()
        on_policy = epochs == 1 and mini_batches == 1
        # Strictly on-policy, the old policy is the current one: ratio = exp(logp - logp.detach()).
        old_logp = None if on_policy else self.logprobs(self.model, batch, micro_batch_size)
        ref_logp = self.logprobs(ref_model, batch, micro_batch_size) if loss.kl_coef > 0 else None
        sums: dict[str, float] = {}
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        for _ in range(epochs):
            order = torch.randperm(batch.num_sequences, generator=generator) if mini_batches > 1 else torch.arange(batch.num_sequences)
            for mini in torch.tensor_split(order, mini_batches):
                metrics = self._optimizer_step(batch, mini, loss, micro_batch_size, old_logp, ref_logp)
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value
        steps = epochs * mini_batches
        return {key: value / steps for key, value in sums.items()}

    def _optimizer_step(self, batch: TrainBatch, mini: torch.Tensor, loss: PolicyLoss, micro_batch_size: int,
                        old_logp: torch.Tensor | None, ref_logp: torch.Tensor | None) -> dict[str, float]:
        total_tokens = float(batch.loss_mask_NT[mini].sum())
        token_sums: dict[str, float] = {}
        policy_loss = 0.0
        self.optimizer.zero_grad(set_to_none=True)
        for index in micro_batches(batch, mini, micro_batch_size):
            micro = batch.select(index).to(self.device)
            # Until after backward: activation checkpointing recomputes with the same attention.
            with _attention_for(self.model, micro.input_ids_NT.shape):
                scalar, per_token = self._backward(micro, index, loss, old_logp, ref_logp, total_tokens, len(mini))
            policy_loss += scalar
            micro_tokens = float(micro.loss_mask_NT.sum())
            for key, value in per_token.items():
                token_sums[key] = token_sums.get(key, 0.0) + float(value) * micro_tokens
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip if self.grad_clip > 0 else math.inf)
        if not torch.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(f"the gradient norm is {grad_norm.item()} at update {self.updates}; "
                                     "weights left unchanged")
        self.optimizer.step()
        self.scheduler.step()
        self.updates += 1
        metrics = {key: value / max(total_tokens, 1.0) for key, value in token_sums.items()}
        metrics.update({"loss/policy": policy_loss, "train/grad_norm": grad_norm.item(),
                        "train/lr": self.optimizer.param_groups[0]["lr"]})
        return metrics

    def _backward(self, micro: TrainBatch, index: torch.Tensor, loss: PolicyLoss, old_logp: torch.Tensor | None,
                  ref_logp: torch.Tensor | None, total_tokens: float, total_sequences: int,
                  ) -> tuple[float, dict[str, torch.Tensor]]:
        """Accumulate one micro-batch's gradient; its loss and per-token metric means."""
        mask_NT = micro.loss_mask_NT
        width = mask_NT.shape[1]
        with self._autocast():
            logp_NT, entropy_NT = token_logprobs(self.model, micro, self.temperature, with_entropy=True)
        old_NT = logp_NT.detach() if old_logp is None else old_logp[index, :width].to(self.device)
        adv_NT = micro.advantages_N[:, None].expand_as(logp_NT)
        loss_NT, objective_metrics = loss.objective(logp_NT, old_NT, adv_NT, mask_NT, **loss.objective_kwargs)
        per_token = {f"loss/{k}": v for k, v in objective_metrics.items()}
        per_token["entropy/mean"] = masked_mean(entropy_NT, mask_NT)
        per_token["rollout/logp_gap"] = masked_mean((logp_NT.detach() - micro.sampling_logp_NT).abs(), mask_NT)
        if ref_logp is not None:
            kl_NT = loss.kl_estimator(logp_NT, ref_logp[index, :width].to(self.device))
            loss_NT = loss_NT + loss.kl_coef * kl_NT
            per_token["kl/mean"] = masked_mean(kl_NT.detach(), mask_NT)
        scalar = loss.aggregation(loss_NT, mask_NT, total_tokens=total_tokens, total_sequences=float(total_sequences))
        if not torch.isfinite(scalar):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(f"the loss is {scalar.item()} at update {self.updates}; weights left unchanged. "
                                     "Lower train.lr, check the rewards for NaN/inf, or use train.dtype=float32")
        scalar.backward()
        return scalar.item(), per_token

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "updates": self.updates}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.updates = state["updates"]


# Below this many attention scores per head (sequences x length^2), plain matmul attention
# beats the CPU flash-attention kernel, forward and backward (measured on SmolLM2-135M:
# 1.2x at 8 x 128 tokens, 1.3x at 2 x 512, even at 1 x 1024) at bounded memory.
EAGER_ATTENTION_MAX_SCORES = 8 * 256 * 256


@contextmanager
def _attention_for(model: Any, shape_NT: torch.Size) -> Iterator[None]:
    """Matmul ("eager") attention for small CPU micro-batches of an sdpa model; else as is."""
    sequences, length = shape_NT
    switch = (next(model.parameters()).device.type == "cpu" and model.config._attn_implementation == "sdpa"
              and sequences * length * length <= EAGER_ATTENTION_MAX_SCORES)
    if not switch:
        yield
        return
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation("sdpa")


# What one more micro-batch costs beyond its tokens (weight casts, kernel launches), in padded
# token positions: about 60 ms against ~1.4 ms per position for SmolLM2-135M on 2 CPU cores.
MICRO_BATCH_OVERHEAD_TOKENS = 48


def micro_batches(batch: TrainBatch, index_N: torch.Tensor, size: int) -> list[torch.Tensor]:
    """`index_N` split into micro-batches of at most `size` sequences of similar length.

    Sequences are sorted by length and cut where the cuts minimise the padded token positions
    computed (each micro-batch is as long as its longest sequence) plus a fixed cost per
    micro-batch: one long completion no longer pads seven short ones to its length. The loss
    is normalised over the whole batch, so the split does not change it."""
    lengths_N = batch.attention_mask_NT[index_N].sum(1)
    order_N = torch.argsort(lengths_N, stable=True)
    by_length_N, sorted_lengths = index_N[order_N], lengths_N[order_N].tolist()
    return [by_length_N[start:end] for start, end in cheapest_cuts(sorted_lengths, size, MICRO_BATCH_OVERHEAD_TOKENS)]


def cheapest_cuts(sorted_lengths: Sequence[int], size: int, overhead: int) -> list[tuple[int, int]]:
    """[start, end) chunks of an ascending list, each at most `size` long, minimising
    sum(chunk length x its last value + overhead), by dynamic programming over the cut points."""
    count = len(sorted_lengths)
    best_cost = [0.0] + [math.inf] * count
    best_start = [0] * (count + 1)
    for end in range(1, count + 1):
        for start in range(max(0, end - size), end):
            cost = best_cost[start] + (end - start) * sorted_lengths[end - 1] + overhead
            if cost < best_cost[end]:
                best_cost[end], best_start[end] = cost, start
    chunks, end = [], count
    while end > 0:
        chunks.append((best_start[end], end))
        end = best_start[end]
    return chunks[::-1]
