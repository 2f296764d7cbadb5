"""Supervised guidance inside RL (guidance.mode; docs/pipelines.md): a loss on expert or replayed
solutions next to the RL loss.

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
solutions) or from the policy's own earlier verified-correct samples (`source="replay"`); the
per-token losses that correct for their not being sampled from the current policy, and the weight
schedules, are reasonrl.algo.guidance.

In the run, `GuidanceSteps` is its participant: it sees each round's groups before replay changes
them (a group is failed by its own samples), adds the mixed loss to the policy's update, and runs
the interleaved supervised step after it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from reasonrl.algo.aggregation import token_mean
from reasonrl.algo.guidance import WEIGHTINGS, guidance_objective, guidance_weight
from reasonrl.config import Config, GuidanceConfig
from reasonrl.methods.parts import Added, RunParts
from reasonrl.sampling import ReplayBuffer, group_accuracy
from reasonrl.training.learner import Learner, PolicyLoss, make_train_batch
from reasonrl.training.targets import sft_group
from reasonrl.types import Completion, Group, Participant, PolicyUpdate, Problem, TrainBatch


class Guidance:
    """Chooses the step's guidance targets and builds their loss; keeps the replayed solutions and,
    in interleave mode, the targets waiting for the next supervised step (both checkpointed).
    `steps` is the run's length, over which the weight decays when guidance.decay_steps is 0."""

    def __init__(self, config: GuidanceConfig, *, steps: int, tokenizer: Any, chat_template: bool, pad_id: int,
                 seed: int = 0):
        if config.mode not in ("mixed", "interleave"):
            raise ValueError(f"guidance.mode={config.mode!r}: choose mixed or interleave")
        if config.on not in ("failed", "all"):
            raise ValueError(f"guidance.on={config.on!r}: choose failed (every sample wrong) or all")
        if config.source not in ("expert", "replay"):
            raise ValueError(f"guidance.source={config.source!r}: choose expert (the problem's solution field) "
                             "or replay (the policy's earlier correct samples)")
        if config.weighting not in WEIGHTINGS:
            raise ValueError(f"guidance.weighting={config.weighting!r} is not one of {WEIGHTINGS}")
        self.config, self.decay_steps = config, config.decay_steps or steps
        guidance_weight(0, config.weight, config.schedule, self.decay_steps)
        self.tokenizer, self.chat_template, self.pad_id = tokenizer, chat_template, pad_id
        self.replay = ReplayBuffer(2, seed=seed) if config.source == "replay" else None
        self.pending: list[Group] = []
        self.targets_used = 0

    def observe(self, indices: Sequence[int], groups: Sequence[Group], step: int) -> None:
        """Take the step's scored groups (`indices`: their problems' positions in the task): remember
        their correct samples (replay source) and queue targets for the problems that qualify."""
        for index, group in zip(indices, groups):
            if self.replay is not None:
                self.replay.add(index, group)
            if self.config.on == "failed" and group_accuracy(group) > 0:
                continue
            target = self._target(index, group, step)
            if target is not None:
                self.pending.append(target)

    def auxiliary(self, step: int) -> tuple[TrainBatch, PolicyLoss] | None:
        """Mixed mode: the batch and loss to add to this step's RL update (None when there is nothing
        to guide or the weight has decayed to 0); the queue is emptied."""
        if self.config.mode != "mixed":
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
        if self.config.mode != "interleave" or step % self.config.every or not self.pending:
            return None
        targets, self.pending = self.pending, []
        self.targets_used += len(targets)
        return self._batch(targets, 1.0), self._loss()

    def weight(self, step: int) -> float:
        return guidance_weight(step, self.config.weight, self.config.schedule, self.decay_steps)

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
        solution = group.problem.metadata.get(self.config.solution_field)
        if solution is None:
            return None
        if not isinstance(solution, str) or not solution.strip():
            raise ValueError(f"problem {group.problem.id!r}: metadata[{self.config.solution_field!r}] must be a "
                             f"non-empty string to guide with, got {solution!r}")
        expert = sft_group(self.tokenizer, replace(group.problem, answer=solution), chat_template=self.chat_template,
                           max_tokens=self.config.max_tokens)
        return replace(expert, prompt_ids=group.prompt_ids)

    def _batch(self, targets: list[Group], weight: float) -> TrainBatch:
        return make_train_batch(targets, [weight] * len(targets), self.pad_id)

    def _loss(self) -> PolicyLoss:
        return PolicyLoss(objective=guidance_objective, aggregation=token_mean,
                          objective_kwargs={"weighting": self.config.weighting, "gamma": self.config.gamma})

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


class GuidanceSteps(Participant):
    """Guidance in the run: it sees the groups before replay changes them; mixed, its loss joins the
    policy's update as the auxiliary; interleaved, a supervised step of `learner` follows the update
    every guidance.every steps. Its loss is logged as loss/guidance."""

    name = "guidance"

    def __init__(self, guidance: Guidance, learner: Learner, micro_batch_size: int):
        self.guidance, self.learner, self.micro_batch_size = guidance, learner, micro_batch_size
        self.lock = threading.Lock()

    def observe(self, step: int, indices: Sequence[int], groups: list[Group]) -> list[Group]:
        with self.lock:
            self.guidance.observe(indices, groups, step)
        return groups

    def contribute(self, step: int, update: PolicyUpdate) -> PolicyUpdate:
        with self.lock:
            return replace(update, auxiliary=self.guidance.auxiliary(step))

    def after_update(self, step: int, batch: TrainBatch, metrics: dict[str, float]) -> None:
        with self.lock:
            interleaved = self.guidance.interleaved(step + 1)
        if interleaved is not None:
            supervised = self.learner.update(*interleaved, micro_batch_size=self.micro_batch_size, step=step)
            metrics["loss/guidance"] = supervised["loss/policy"]
        if "loss/auxiliary" in metrics:
            metrics["loss/guidance"] = metrics.pop("loss/auxiliary")
        with self.lock:
            metrics |= self.guidance.metrics(step)

    def state_dict(self) -> dict[str, Any]:
        return self.guidance.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.guidance.load_state_dict(state)


def build(cfg: Config, parts: RunParts) -> Added:
    """Guidance's participant, when guidance.mode is not off."""
    if cfg.guidance.mode == "off":
        return Added()
    guidance = Guidance(cfg.guidance, steps=cfg.train.steps, tokenizer=parts.engine.tokenizer,
                        chat_template=cfg.model.chat_template, pad_id=parts.engine.pad_id, seed=cfg.run.seed)
    return Added(participants=(GuidanceSteps(guidance, parts.learner, cfg.train.micro_batch_size),))
