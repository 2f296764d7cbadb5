"""The run skeleton every training command shares (`train`, `sft`, `dpo`, `rft`): what happens
around each step, written once, while the command keeps only what differs (its data, its update,
its metrics).

    start = start_run(cfg)                       # or start_stage(cfg): sft, dpo, rft
    ...build the parts from start...
    loop = RunLoop.open(start, stateful, save=PolicyCheckpoints(start, stateful, model=policy, tokenizer=tokenizer),
                        desc="sft", show=show_metrics(loss=("loss/sft", ".3f")))
    while loop.running():                        # train.steps not reached, no budget spent
        metrics = ...one step at loop.step...
        loop.record(metrics)                     # counted, logged, shown on the progress bar
        loop.save_if_due()                       # run.save_every, the last step, a spent budget
    loop.close()
    return loop.final_checkpoint()

`RunLoop.open` restores the stateful parts and opens the logger (runs.open_run). The progress bar
and the train.max_minutes clock start at the first `running()`, so that what the command does
before its first step (`train`'s evaluation) counts in neither; the bar closes at the last. A
spent budget (train.max_minutes, or one the command names, e.g. train.max_generated_tokens)
writes a checkpoint whether one is due or not, says so, and ends the loop: `run.resume=true`
continues from there.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from reasonrl.config import Config, ConfigError
from reasonrl.training.checkpoint import save_checkpoint
from reasonrl.training.logging import RunLogger, format_step
from reasonrl.training.runs import RunStart, open_run, start_run, trainer_state

# Advances the progress bar after a step: (bar, step, the step's metrics).
Show = Callable[[Any, int, Mapping[str, float]], None]


def start_stage(cfg: Config) -> RunStart:
    """start_run for a stage (sft, dpo, rft). train.max_generated_tokens, the budget of `reasonrl
    train`, is refused before anything is claimed or built, rather than ignored."""
    if cfg.train.max_generated_tokens:
        raise ConfigError("train.max_generated_tokens is a budget of `reasonrl train`; sft, dpo and rft stop at "
                          "train.steps or train.max_minutes")
    return start_run(cfg)


def checkpoint_due(cfg: Config, step: int) -> bool:
    """Whether a checkpoint is due after `step`: every run.save_every steps, and after the last."""
    return step == cfg.train.steps or bool(cfg.run.save_every and step % cfg.run.save_every == 0)


def minutes_deadline(cfg: Config) -> float:
    """When (time.monotonic) a run started now has spent train.max_minutes (inf: no limit)."""
    return time.monotonic() + 60 * cfg.train.max_minutes if cfg.train.max_minutes else math.inf


def announce_budget_stop(spent: str, step: int) -> None:
    """Say that a run stops early after `step` because of the budget `spent` names."""
    tqdm.write(f"{spent} after step {step}: stopping here (checkpoint saved; run.resume=true continues)")


@dataclass(frozen=True)
class PolicyCheckpoints:
    """Writes a run's checkpoint at a step: the policy `model` with its tokenizer, every stateful
    part's state, and a reference model reset to a past policy (not reproducible from the config)."""

    start: RunStart
    stateful: Mapping[str, Any]
    model: Any
    tokenizer: Any
    ref_model: Any = None

    def __call__(self, step: int) -> Path:
        return save_checkpoint(self.start.run_dir, step, model=self.model, tokenizer=self.tokenizer,
                               keep=self.start.cfg.run.keep_checkpoints,
                               state=trainer_state(self.stateful, self.ref_model,
                                                   optimizer=self.start.cfg.run.save_optimizer))


def show_metrics(*, log_every: int = 0, **shown: tuple[str, str]) -> Show:
    """A `Show` that advances the bar with metrics beside it: name=(metric key, format spec); a
    metric the step did not report shows as nan. Every `log_every` steps (run.log_every; 0: never) it
    also prints a line of those metrics and the step's time."""

    def show(bar: Any, step: int, metrics: Mapping[str, float]) -> None:
        bar.set_postfix(**{name: format(metrics.get(key, math.nan), spec) for name, (key, spec) in shown.items()})
        bar.update()
        if log_every and step % log_every == 0:
            tqdm.write(format_step(step, metrics, [key for key, _ in shown.values()] + ["perf/step_s"]))

    return show


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run's steps; the message says where it stopped (`where`, which a pipeline
    prefixes with its stage) and the command that continues it."""

    def __init__(self, where: str, resume: str):
        super().__init__(f"{where}; resume with `{resume}`")
        self.where = where


class RunLoop:
    """The steps of an opened run, from its restored step to train.steps or a spent budget; see the
    module docstring. `step` is the number of steps done, `logger` the run's logger, `checkpoint`
    the newest checkpoint (the one resumed from until a step writes one)."""

    def __init__(self, start: RunStart, logger: RunLogger, step: int, *, save: Callable[[int], Path], desc: str,
                 show: Show, unit: str = "step") -> None:
        self.cfg, self.logger, self.step, self.run_dir = start.cfg, logger, step, start.run_dir
        self._start = start
        self.checkpoint: Path | None = start.resume_from
        self._save, self._desc, self._unit, self._show = save, desc, unit, show
        self._bar: Any = None
        self._deadline = math.inf
        self._stopped = False

    @classmethod
    def open(cls, start: RunStart, stateful: Mapping[str, Any], *, save: Callable[[int], Path], desc: str,
             show: Show, unit: str = "step", ref_model: Any = None) -> RunLoop:
        """Restore the `stateful` parts (and a reset `ref_model`) from the checkpoint `start`
        resumes from, save the config, open the logger; `save(step)` writes a checkpoint, `show`
        advances the progress bar named `desc`, counting in `unit`s. `desc` is also the command
        that resumes the run (`reasonrl DESC`): train, sft, dpo or rft."""
        step, logger = open_run(start, stateful, ref_model)
        return cls(start, logger, step, save=save, desc=desc, show=show, unit=unit)

    def running(self) -> bool:
        """Whether another step is to run; the first call starts the progress bar and the
        train.max_minutes clock, the last (False) closes the bar."""
        if self._bar is None:
            self._bar = tqdm(total=self.cfg.train.steps, initial=self.step, desc=self._desc, unit=self._unit,
                             disable=not self.cfg.run.progress)
            self._deadline = minutes_deadline(self.cfg)
        if self._stopped or self.step >= self.cfg.train.steps:
            self._bar.close()
            return False
        if self._start.cpu is not None:
            self._start.cpu.rebalance()  # runs started or finished since the last step change the share
        return True

    def record(self, metrics: Mapping[str, float]) -> int:
        """Count a step done, log its `metrics` at its number and show it; that number."""
        self.step += 1
        self.logger.log(self.step, metrics)
        self._show(self._bar, self.step, metrics)
        return self.step

    def save_if_due(self, spent: str = "") -> None:
        """Checkpoint after the step recorded last when one is due (checkpoint_due) or a budget is
        spent: train.max_minutes, checked first, or the one `spent` names ('': none); a spent
        budget also ends the loop."""
        if time.monotonic() > self._deadline:
            spent = f"train.max_minutes={self.cfg.train.max_minutes:g} reached"
        if checkpoint_due(self.cfg, self.step) or spent:
            self.checkpoint = self._save(self.step)
        if spent:
            announce_budget_stop(spent, self.step)
            self._stopped = True

    def interrupted(self) -> RunInterrupted:
        """What to raise on Ctrl-C: where the run stopped, its last checkpoint, how to resume."""
        last = (f"its last checkpoint is {self.checkpoint}" if self.checkpoint is not None
                else "no checkpoint was written yet (run.save_every)")
        return RunInterrupted(f"interrupted at step {self.step} of {self.cfg.train.steps}; {last}",
                              f"reasonrl {self._desc} {self.run_dir / 'config.toml'} run.resume=true")

    def close(self) -> None:
        """Close the logger (its TensorBoard writer, its W&B run), release the run directory (its
        `.lock` goes with it) and the run's share of the CPU cores."""
        self.logger.close()
        self._start.release()

    def run_steps(self, step: Callable[[], Mapping[str, float]]) -> Path:
        """Run `step` (one step's work, returning its metrics) while steps remain, recording each and
        checkpointing when due; close the run and return its final checkpoint. Ctrl-C closes the run
        and raises `interrupted()`. (The RL loop, which also closes engines, runs its own.)"""
        try:
            while self.running():
                self.record(step())
                self.save_if_due()
        except KeyboardInterrupt:
            self.close()
            raise self.interrupted() from None
        self.close()
        return self.final_checkpoint()

    def final_checkpoint(self) -> Path:
        """The run's last checkpoint; an error when it trained no step and resumed from none."""
        if self.checkpoint is None:
            raise ValueError("train.steps=0: nothing was trained")
        return self.checkpoint
