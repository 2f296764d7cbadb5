"""A run's directory and what every training command (`train`, `sft`, `dpo`, `rft`) does around
its loop: where it resumes from (a run directory that holds checkpoints is never overwritten),
its device and seed, which stateful parts it restores and saves, its saved config and its logger.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from reasonrl.checkpoint import checkpoints, latest_checkpoint, load_trainer_state
from reasonrl.config import Config
from reasonrl.logging import RunLogger
from reasonrl.models import pick_device


@dataclass(frozen=True)
class RunStart:
    """A run about to build its parts: its config (run.dir's time placeholders filled in), its
    directory, the checkpoint it resumes from, its device."""

    cfg: Config
    run_dir: Path
    resume_from: Path | None
    device: torch.device


def start_run(cfg: Config) -> RunStart:
    """Fill in run.dir, find the checkpoint to resume from, pick the device and seed torch."""
    cfg = replace(cfg, run=replace(cfg.run, dir=time.strftime(cfg.run.dir)))
    resume_from = checkpoint_to_resume(cfg)
    device = pick_device(cfg.run.device)
    torch.manual_seed(cfg.run.seed)
    return RunStart(cfg=cfg, run_dir=Path(cfg.run.dir), resume_from=resume_from, device=device)


def open_run(start: RunStart, stateful: Mapping[str, Any], ref_model: Any = None) -> tuple[int, RunLogger]:
    """Restore the stateful parts, save the config in the run directory and open its logger; the
    step to continue from (0 for a new run) and the logger."""
    step = restore_state(start.resume_from, stateful, ref_model)
    start.run_dir.mkdir(parents=True, exist_ok=True)
    start.cfg.save(start.run_dir / "config.toml")
    logger = RunLogger(start.run_dir, tensorboard=start.cfg.run.tensorboard,
                       resume_step=step if start.resume_from else None)
    return step, logger


def checkpoint_to_resume(cfg: Config) -> Path | None:
    if cfg.run.resume:
        found = latest_checkpoint(cfg.run.dir)
        if found is None:
            raise FileNotFoundError(f"run.resume=true but {cfg.run.dir} has no checkpoint to resume from")
        return found
    if checkpoints(cfg.run.dir):
        raise FileExistsError(f"{cfg.run.dir} already holds checkpoints: continue it with run.resume=true, "
                              "or choose a new run.dir")
    return None


def trainer_state(stateful: Mapping[str, Any], ref_model: Any = None) -> dict[str, Any]:
    """The state of every stateful part (None parts left out), and of a reference model that was
    reset to a past policy (not reproducible from the config)."""
    state = {name: part.state_dict() for name, part in stateful.items() if part is not None}
    if ref_model is not None:
        state["reference"] = ref_model.state_dict()
    return state


def restore_state(resume_from: Path | None, stateful: Mapping[str, Any], ref_model: Any = None) -> int:
    """The step to continue from (0 for a new run), with every stateful part restored."""
    if resume_from is None:
        return 0
    state = load_trainer_state(resume_from)
    for name, part in stateful.items():
        # Older checkpoints: a fixed KL coefficient; synchronous runs: no rollouts in flight.
        if part is None or (name in ("kl_coef", "pipeline") and name not in state):
            continue
        if name not in state:
            raise ValueError(f"{resume_from} holds no {name} state: it was written with another algorithm config")
        part.load_state_dict(state[name])
    if "reference" in state:
        ref_model.load_state_dict(state["reference"])
    return state["step"]
