"""The policy's loss, composed from the config's choices on the loss side, so that the learner only
computes log-probs, accumulates gradients and steps (reasonrl.training.learner):

per token, loss_t = objective(logp, old_logp, A)_t            (algo.objective, its knobs)
                    x sg(min(r_t, tis_cap))                   (truncated IS, algo.tis; optional)
                    - entropy_coef x H_t                       (an entropy bonus; optional)
                    + kl_coef x KL(logp, ref_logp)_t           (the KL penalty in the loss; optional)
then one scalar by the aggregation (algo.aggregation) over the optimizer step's tokens or sequences.

Two parts act on a batch before that: masked importance sampling (`mask_mismatched`, algo.mis)
takes the samples whose learner/sampler ratio lies outside its band off the loss mask, and a
batch-wide token selection (`select_tokens`: Clip-Cov, KL-Cov) chooses the tokens an objective
treats apart from the log-probs of the whole optimizer step. The loss says what it needs from the
learner: the old log-probs even in a single optimizer step, the reference's, the entropy's gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from reasonrl.algo.correction import rejection_mask, rejection_stats, truncated_is_weights
from reasonrl.algo.objectives import masked_mean
from reasonrl.spec import spec_of
from reasonrl.types import TrainBatch


@dataclass(frozen=True)
class PolicyLoss:
    """What to minimise, as functions from reasonrl.algo with their hyper-parameters."""

    objective: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
    aggregation: Callable[..., torch.Tensor]
    objective_kwargs: Mapping[str, Any] = field(default_factory=dict)
    aggregation_kwargs: Mapping[str, Any] = field(default_factory=dict)
    kl_estimator: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    # Truncated importance weights between the learner's and the sampler's log-probs:
    # "" (off), "token" or "sequence", capped at tis_cap.
    tis_level: str = ""
    tis_cap: float = 2.0
    # Masked importance sampling: "" (off), "token", "sequence" or "geometric"; the samples whose
    # learner/sampler ratio lies outside [mis_low, mis_high] leave the loss and its normaliser.
    mis_level: str = ""
    mis_low: float = 0.5
    mis_high: float = 2.0
    # For objectives whose token choice is a statistic of the optimizer step's whole batch
    # (Clip-Cov, KL-Cov): (logp, old_logp, adv, mask, generator=, **kwargs) -> selected_NT over
    # all of the step's sequences, passed to the objective as `selected_NT`.
    token_selection: Callable[..., torch.Tensor] | None = None
    selection_kwargs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def objective_inputs(self) -> frozenset[str]:
        """What the objective declares it takes besides the four tensors (reasonrl.spec): `generator`
        (it draws random numbers), `sampling_logp_NT` (the rollout engine's log-probs: it corrects for
        the sampler itself, e.g. TOPR)."""
        return spec_of(self.objective).inputs

    @property
    def needs_old_logp(self) -> bool:
        """Whether the loss reads the policy's log-probs before the update even when the update is a
        single optimizer step (where they equal the current ones): a batch-wide token selection, or
        masked importance sampling, which compares them with the sampler's."""
        return self.token_selection is not None or bool(self.mis_level)

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    @property
    def entropy_grad(self) -> bool:
        """Whether the entropy is part of the loss (its gradient is then needed)."""
        return self.entropy_coef > 0

    def mask_mismatched(self, batch: TrainBatch) -> tuple[TrainBatch, dict[str, float]]:
        """With masked importance sampling, the batch without the samples whose learner/sampler ratio
        lies outside the band (off the loss mask, so that the optimizer steps count only the kept
        tokens and sequences), and what the ratios were; else the batch as it is."""
        if not self.mis_level:
            return batch, {}
        keep_NT = rejection_mask(batch.old_logp_NT, batch.sampling_logp_NT, batch.loss_mask_NT,
                                 level=self.mis_level, low=self.mis_low, high=self.mis_high)
        stats = rejection_stats(batch.old_logp_NT, batch.sampling_logp_NT, batch.loss_mask_NT, keep_NT)
        return replace(batch, loss_mask_NT=batch.loss_mask_NT * keep_NT,
                       advantages_NT=batch.advantages_NT * keep_NT), stats

    def select_tokens(self, current_logp_NT: torch.Tensor, batch: TrainBatch, mini: torch.Tensor,
                      generator: torch.Generator) -> TrainBatch:
        """The batch with `selected_NT` chosen by the token selection over every sequence of the
        optimizer step `mini`, from the policy's current log-probs `current_logp_NT`."""
        chosen_NT = self.token_selection(current_logp_NT[mini], batch.old_logp_NT[mini], batch.advantages_NT[mini],
                                         batch.loss_mask_NT[mini], generator=generator, **self.selection_kwargs)
        selected_NT = torch.zeros(batch.loss_mask_NT.shape, dtype=torch.bool)
        selected_NT[mini] = chosen_NT
        return replace(batch, selected_NT=selected_NT)

    def token_losses(self, logp_NT: torch.Tensor, entropy_NT: torch.Tensor, micro: TrainBatch,
                     generator: torch.Generator) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Each token's loss in the micro-batch (see the module docstring), and per-token metric means."""
        mask_NT = micro.loss_mask_NT
        old_NT = logp_NT.detach() if micro.old_logp_NT is None else micro.old_logp_NT
        extra: dict[str, Any] = {"generator": generator} if "generator" in self.objective_inputs else {}
        if "sampling_logp_NT" in self.objective_inputs:
            extra["sampling_logp_NT"] = micro.sampling_logp_NT
        if micro.selected_NT is not None:
            extra["selected_NT"] = micro.selected_NT
        loss_NT, objective_metrics = self.objective(logp_NT, old_NT, micro.advantages_NT, mask_NT,
                                                    **self.objective_kwargs, **extra)
        per_token = {f"loss/{k}": v for k, v in objective_metrics.items()}
        # The token ratio to the policy before the update, whatever the objective makes of it:
        # exactly 1 at the first optimizer step, so drift there means a numerics mismatch.
        ratio_NT = torch.exp(logp_NT.detach() - old_NT)
        per_token["loss/ratio_mean"] = masked_mean(ratio_NT, mask_NT)
        per_token["loss/ratio_max"] = ratio_NT.masked_fill(~mask_NT.bool(), -math.inf).max()
        per_token["entropy/mean"] = masked_mean(entropy_NT.detach(), mask_NT)
        per_token["rollout/logp_gap"] = masked_mean((logp_NT.detach() - micro.sampling_logp_NT).abs(), mask_NT)
        if self.tis_level:
            weights_NT = truncated_is_weights(old_NT, micro.sampling_logp_NT, mask_NT, cap=self.tis_cap,
                                              level=self.tis_level)
            loss_NT = loss_NT * weights_NT
            per_token["rollout/tis_weight"] = masked_mean(weights_NT, mask_NT)
        if self.entropy_coef:
            loss_NT = loss_NT - self.entropy_coef * entropy_NT
        if self.kl_coef > 0:
            kl_NT = self.kl_estimator(logp_NT, micro.ref_logp_NT)
            loss_NT = loss_NT + self.kl_coef * kl_NT
            per_token["kl/mean"] = masked_mean(kl_NT.detach(), mask_NT)
        return loss_NT, per_token

    def aggregate(self, loss_NT: torch.Tensor, micro: TrainBatch, *, total_tokens: float,
                  total_sequences: int) -> torch.Tensor:
        """The micro-batch's share of the optimizer step's scalar loss. An aggregation that declares
        `max_tokens` (Dr. GRPO's constant normaliser) gets the batch's generation budget."""
        extra = {}
        if "max_tokens" in spec_of(self.aggregation).inputs:
            if micro.max_new_tokens is None:
                raise ValueError(f"the aggregation {self.aggregation.__name__!r} normalises by the generation budget, "
                                 "which the batch does not carry (make it from groups the rollout producer tagged)")
            extra["max_tokens"] = micro.max_new_tokens
        return self.aggregation(loss_NT, micro.loss_mask_NT, total_tokens=total_tokens,
                                total_sequences=float(total_sequences), **self.aggregation_kwargs, **extra)
