"""Supervised guidance inside RL: a loss on expert or replayed solutions next to the RL loss.

A problem whose G samples all fail has zero group-relative advantage: RL cannot learn from it.
Guidance shows the policy a correct solution instead, in one of two ways:

- **mixed** (one objective): L = L_RL + mu_t * L_guide, both gradients in the same optimizer step,
  as in SRFT (Fu et al. 2025, "SRFT: A Single-Stage Method with Supervised and Reinforcement
  Fine-Tuning") and CHORD (Zhang et al. 2025, "On-Policy RL Meets Off-Policy Experts: Harmonizing
  Supervised Fine-Tuning and Reinforcement Learning via Dynamic Weighting"), whose weight mu_t
  decays as the policy improves (`schedule` constant | linear | cosine over `decay_steps`);
- **interleave**: the solutions of failed problems are collected, and every `every` RL steps one
  separate supervised step trains on them, as in ReLIFT (Ma et al. 2025, "Learning What
  Reinforcement Learning Can't: Interleaved Online Fine-Tuning for Hardest Questions").

Solutions come from the problem (`source="expert"`: `metadata[solution_field]`, e.g. GSM8K's worked
solutions) or from the policy's own earlier verified-correct samples (`source="replay"`). They
were not sampled from the current policy, so the per-token loss can correct for that:

- `weighting="nll"`: -log p, plain supervised learning;
- `weighting="phi"`: -sg(p (1 - p)) log p, CHORD-phi: tokens the policy already predicts (p ~ 1)
  or finds implausible (p ~ 0) get little weight, which keeps off-policy targets from collapsing
  the policy's entropy;
- `weighting="shaped"`: -p / (p + gamma), LUFFY's policy shaping (Yan et al. 2025, "Learning to
  Reason under Off-Policy Guidance"), a regularised importance weight whose gradient
  gamma p / (p + gamma)^2 grad log p emphasises low-probability tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from reasonrl.algo.aggregation import token_mean
from reasonrl.sampling import ReplayBuffer, group_accuracy
from reasonrl.stages.sft import sft_group
from reasonrl.training.learner import PolicyLoss, make_train_batch
from reasonrl.types import Completion, Group, Problem, TrainBatch

WEIGHTINGS = ("nll", "phi", "shaped")
SCHEDULES = ("constant", "linear", "cosine")


def guidance_objective(logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, advantages_NT: torch.Tensor,
                       mask_NT: torch.Tensor, *, weighting: str = "nll", gamma: float = 0.1,
                       ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss on target tokens, scaled by `advantages_NT` (the guidance weight there);
    the learner's objective signature, so the learner's micro-batching applies unchanged."""
    p_NT = logp_NT.exp()
    if weighting == "nll":
        per_token_NT = -logp_NT
    elif weighting == "phi":
        per_token_NT = -(p_NT * (1 - p_NT)).detach() * logp_NT
    elif weighting == "shaped":
        per_token_NT = -p_NT / (p_NT + gamma)
    else:
        raise ValueError(f"guidance weighting {weighting!r} is not one of {WEIGHTINGS}")
    loss_NT = advantages_NT * per_token_NT * mask_NT
    target_tokens = mask_NT.sum().clamp(min=1)
    return loss_NT, {"guidance_nll": (-logp_NT.detach() * mask_NT).sum() / target_tokens}


def guidance_weight(step: int, weight: float, schedule: str, decay_steps: int) -> float:
    """mu at `step` (0-based): `weight`, constant or decaying to 0 at `decay_steps`."""
    if schedule not in SCHEDULES:
        raise ValueError(f"guidance schedule {schedule!r} is not one of {SCHEDULES}")
    if schedule == "constant":
        return weight
    progress = min(step / max(decay_steps, 1), 1.0)
    if schedule == "linear":
        return weight * (1 - progress)
    return weight * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class GuidanceSettings:
    mode: str = "mixed"  # mixed | interleave
    weight: float = 0.1
    schedule: str = "constant"
    decay_steps: int = 0
    on: str = "failed"  # failed | all
    source: str = "expert"  # expert | replay
    solution_field: str = "solution"
    weighting: str = "nll"
    gamma: float = 0.1
    every: int = 4
    max_tokens: int = 512


class Guidance:
    """Chooses the step's guidance targets and builds their loss; keeps the replayed solutions and,
    in interleave mode, the targets waiting for the next supervised step (both checkpointed)."""

    def __init__(self, settings: GuidanceSettings, *, tokenizer: Any, chat_template: bool, pad_id: int,
                 seed: int = 0):
        if settings.mode not in ("mixed", "interleave"):
            raise ValueError(f"guidance.mode={settings.mode!r}: choose mixed or interleave")
        if settings.on not in ("failed", "all"):
            raise ValueError(f"guidance.on={settings.on!r}: choose failed (every sample wrong) or all")
        if settings.source not in ("expert", "replay"):
            raise ValueError(f"guidance.source={settings.source!r}: choose expert (the problem's solution field) "
                             "or replay (the policy's earlier correct samples)")
        if settings.weighting not in WEIGHTINGS:
            raise ValueError(f"guidance.weighting={settings.weighting!r} is not one of {WEIGHTINGS}")
        guidance_weight(0, settings.weight, settings.schedule, settings.decay_steps)
        self.settings, self.tokenizer, self.chat_template, self.pad_id = settings, tokenizer, chat_template, pad_id
        self.replay = ReplayBuffer(2, seed=seed) if settings.source == "replay" else None
        self.pending: list[Group] = []
        self.targets_used = 0

    def observe(self, indices: Sequence[int], groups: Sequence[Group], step: int) -> None:
        """Take the step's scored groups (`indices`: their problems' positions in the task): remember
        their correct samples (replay source) and queue targets for the problems that qualify."""
        for index, group in zip(indices, groups):
            if self.replay is not None:
                self.replay.add(index, group)
            if self.settings.on == "failed" and group_accuracy(group) > 0:
                continue
            target = self._target(index, group, step)
            if target is not None:
                self.pending.append(target)

    def auxiliary(self, step: int) -> tuple[TrainBatch, PolicyLoss] | None:
        """Mixed mode: the batch and loss to add to this step's RL update (None when there is nothing
        to guide or the weight has decayed to 0); the queue is emptied."""
        if self.settings.mode != "mixed":
            return None
        weight = self.weight(step)
        targets, self.pending = self.pending, []
        if not targets or weight <= 0:
            return None
        self.targets_used += len(targets)
        return self._batch(targets, weight), self._loss()

    def interleaved(self, step: int) -> tuple[TrainBatch, PolicyLoss] | None:
        """Interleave mode: every `every` steps (`step` counted from 1), the batch and loss of one
        supervised step on the queued targets; the queue is emptied."""
        if self.settings.mode != "interleave" or step % self.settings.every or not self.pending:
            return None
        targets, self.pending = self.pending, []
        self.targets_used += len(targets)
        return self._batch(targets, 1.0), self._loss()

    def weight(self, step: int) -> float:
        s = self.settings
        return guidance_weight(step, s.weight, s.schedule, s.decay_steps)

    def metrics(self, step: int) -> dict[str, float]:
        return {"guidance/weight": self.weight(step), "guidance/targets": float(self.targets_used),
                "guidance/pending": float(len(self.pending))}

    def _target(self, index: int, group: Group, step: int) -> Group | None:
        if self.replay is not None:
            stored = self.replay.stored.get(index)
            if not stored:
                return None
            completion = stored[(step + index) % len(stored)]
            return Group(problem=group.problem, prompt_ids=group.prompt_ids, completions=(completion,))
        solution = group.problem.metadata.get(self.settings.solution_field)
        if solution is None:
            return None
        if not isinstance(solution, str) or not solution.strip():
            raise ValueError(f"problem {group.problem.id!r}: metadata[{self.settings.solution_field!r}] must be a "
                             f"non-empty string to guide with, got {solution!r}")
        expert = sft_group(self.tokenizer, replace(group.problem, answer=solution), chat_template=self.chat_template,
                           max_tokens=self.settings.max_tokens)
        return replace(expert, prompt_ids=group.prompt_ids)

    def _batch(self, targets: list[Group], weight: float) -> TrainBatch:
        return make_train_batch(targets, [weight] * len(targets), self.pad_id)

    def _loss(self) -> PolicyLoss:
        return PolicyLoss(objective=guidance_objective, aggregation=token_mean,
                          objective_kwargs={"weighting": self.settings.weighting, "gamma": self.settings.gamma})

    def state_dict(self) -> dict[str, Any]:
        return {"replay": self.replay.state_dict() if self.replay is not None else None,
                "pending": [_group_state(g) for g in self.pending], "targets_used": self.targets_used}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.replay is not None and state["replay"] is not None:
            self.replay.load_state_dict(state["replay"])
        self.pending = [_group_from_state(g) for g in state["pending"]]
        self.targets_used = state["targets_used"]


def _group_state(group: Group) -> dict[str, Any]:
    problem = group.problem
    return {"problem": {"id": problem.id, "prompt": problem.prompt, "answer": problem.answer,
                        "metadata": dict(problem.metadata)},
            "prompt_ids": list(group.prompt_ids),
            "completions": [{"token_ids": list(c.token_ids), "text": c.text, "logprobs": list(c.logprobs),
                             "finish_reason": c.finish_reason, "loss_mask": None if c.loss_mask is None else list(c.loss_mask)}
                            for c in group.completions]}


def _group_from_state(state: dict[str, Any]) -> Group:
    completions = tuple(Completion(token_ids=tuple(c["token_ids"]), text=c["text"], logprobs=tuple(c["logprobs"]),
                                   finish_reason=c["finish_reason"],
                                   loss_mask=None if c["loss_mask"] is None else tuple(c["loss_mask"]))
                        for c in state["completions"])
    return Group(problem=Problem(**state["problem"]), prompt_ids=tuple(state["prompt_ids"]), completions=completions)

