"""On-policy distillation (distill.teacher; docs/distillation.md): a teacher scores the student's
own samples, and its per-token reverse KL (reasonrl.algo.distill) joins the advantages of the
reward. The teachers (a local model or a server) are reasonrl.training.teachers; here, which
teacher distill.teacher names, and the estimation step that adds its term.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from reasonrl.algo.distill import reverse_kl_advantages
from reasonrl.config import Config
from reasonrl.methods.parts import Added, RunParts
from reasonrl.models import frozen, load_model, load_tokenizer, resolve_dtype
from reasonrl.training.checkpoint import checkpoints
from reasonrl.training.teachers import LocalTeacher, ServedTeacher, Teacher
from reasonrl.types import Estimation, Group, TrainBatch


@dataclass
class DistilledEstimation:
    """An advantage estimation followed by the teacher's per-token term
    (reasonrl.algo.distill.reverse_kl_advantages), with the student's log-probs from the sampler."""

    estimate: Estimation
    teacher: Teacher
    weight: float = 1.0
    reward_weight: float = 1.0

    def __call__(self, groups: Sequence[Group], pad_id: int, kl_coef: float) -> tuple[TrainBatch, dict[str, float]]:
        batch, metrics = self.estimate(groups, pad_id, kl_coef)
        teacher_NT = self.teacher.logprobs(batch)
        advantages_NT, distill_metrics = reverse_kl_advantages(
            batch.advantages_NT, batch.sampling_logp_NT, teacher_NT, batch.loss_mask_NT, weight=self.weight,
            reward_weight=self.reward_weight)
        return replace(batch, advantages_NT=advantages_NT), metrics | distill_metrics

    @property
    def critic(self) -> Any:
        return self.estimate.critic


def teacher_checkpoint(spec: str, run_dir: Path) -> Path:
    """`self:STEP` (e.g. self:step_000010 or self:10): that checkpoint of the run directory."""
    step = spec.removeprefix("self:").removeprefix("step_")
    if not step.isdigit():
        raise ValueError(f"distill.teacher={spec!r}: expected self:step_NNNNNN or self:N (a checkpoint of run.dir)")
    found = {int(path.name.removeprefix("step_")): path for path in checkpoints(run_dir)}
    if int(step) not in found:
        available = ", ".join(path.name for path in found.values()) or "none"
        raise FileNotFoundError(f"distill.teacher={spec!r}: no checkpoint step_{int(step):06d} in {run_dir}/checkpoints "
                                f"(available: {available}); give a checkpoint directory's path to use another run's")
    return found[int(step)]


def build_teacher(cfg: Config, device: torch.device, run_dir: Path) -> Teacher:
    """The teacher cfg.distill.teacher names: served (a URL), the policy's start ('self'), a checkpoint
    of this run (self:STEP), or a model."""
    d = cfg.distill
    if d.teacher.startswith(("http://", "https://")):
        return ServedTeacher(d.teacher, model=d.served_model, request_size=d.request_size)
    if d.teacher == "self":
        name = cfg.model.name
    elif d.teacher.startswith("self:"):
        name = str(teacher_checkpoint(d.teacher, run_dir))
    else:
        name = d.teacher
    model = frozen(load_model(name, dtype=resolve_dtype(d.dtype, device), device=device, setting="distill.teacher"))
    return LocalTeacher(model, load_tokenizer(name, setting="distill.teacher"), name=d.teacher,
                        micro_batch_size=cfg.train.micro_batch_size)


def build(cfg: Config, parts: RunParts) -> Added:
    """The estimation followed by the teacher's term, when distill.teacher is set (its tokenizer checked)."""
    d = cfg.distill
    if not d.teacher:
        return Added()
    teacher = build_teacher(cfg, parts.device, parts.run_dir)
    teacher.check_tokenizer(parts.tokenizer)
    # Alone, the teacher's term has a gradient whatever the rewards: groups of equal rewards are not idle.
    relaxed = {} if d.reward_weight else {"zero_std_max": 1.0}
    return Added(estimate=DistilledEstimation(parts.estimate, teacher, weight=d.weight, reward_weight=d.reward_weight),
                 alarm_thresholds=relaxed)
