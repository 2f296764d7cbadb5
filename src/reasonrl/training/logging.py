"""Where metrics and rollouts go: `metrics.jsonl`, `rollouts.jsonl` (with a line for each failed
episode, its error in place of a completion), `updates.jsonl` (the metrics of every optimizer step,
when a step takes several) and `reward_errors.jsonl` (groups whose reward failed, when they are
skipped) in the run directory, TensorBoard when it is installed, Weights &
Biases when asked (`WandbTracker`: the metrics, the config, rollout samples as a table), and the
console (a progress bar, the main metrics, evaluations). Every line carries its step, so a resumed
run first drops what was logged after the checkpoint it resumes from (reasonrl.training.jsonl: in
place, streamed, safe against a kill at any point)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from reasonrl.training.jsonl import records, truncate_after, warn
from reasonrl.types import CORRECT, Group

# The logs written at every step: one that ends before the checkpoint's step has lost lines.
_EVERY_STEP = ("metrics.jsonl", "rollouts.jsonl")


class RunLogger:
    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True, resume_step: int | None = None,
                 wandb: WandbTracker | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.rollouts_path = self.run_dir / "rollouts.jsonl"
        self.reward_errors_path = self.run_dir / "reward_errors.jsonl"
        self.updates_path = self.run_dir / "updates.jsonl"
        for path in (self.metrics_path, self.rollouts_path, self.reward_errors_path, self.updates_path):
            if resume_step is None:
                path.unlink(missing_ok=True)
            else:
                _resume_log(path, resume_step)
        self.writer = _tensorboard_writer(self.run_dir / "tensorboard") if tensorboard else None
        self.wandb = wandb

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        with self.metrics_path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(key, value, step)
            self.writer.flush()
        if self.wandb is not None:
            self.wandb.log(step, metrics)

    def log_rollouts(self, step: int, groups: Sequence[Group], advantages: Sequence[float] | None) -> None:
        """Every completion of `groups` to rollouts.jsonl, with its advantage (None: the step made no update)."""
        advantage = iter(advantages if advantages is not None else [None] * sum(g.size for g in groups))
        records = []
        with self.rollouts_path.open("a") as f:
            for group in groups:
                for g, completion in enumerate(group.completions):
                    record = {
                        "step": step,
                        "problem_id": group.problem.id,
                        "prompt": group.problem.prompt,
                        "answer": group.problem.answer,
                        "completion": completion.text,
                        "finish_reason": completion.finish_reason,
                        "num_tokens": len(completion.token_ids),
                        "reward": group.rewards[g] if group.rewards is not None else None,
                        "components": {name: values[g] for name, values in group.reward_components.items()},
                        "advantage": next(advantage),
                        "policy_version": completion.policy_version,
                    }
                    f.write(json.dumps(record) + "\n")
                    records.append(record)
                f.writelines(json.dumps(_failed_episode(step, group, error)) + "\n" for error in group.failures or ())
        if self.wandb is not None:
            self.wandb.log_rollouts(step, records)

    def log_optimizer_steps(self, step: int, optimizer_steps: Sequence[Mapping[str, float]]) -> None:
        """The metrics of each optimizer step of a training step that took several, to updates.jsonl."""
        if len(optimizer_steps) < 2:
            return
        with self.updates_path.open("a") as f:
            for index, metrics in enumerate(optimizer_steps):
                f.write(json.dumps({"step": step, "optimizer_step": index, **metrics}) + "\n")

    def log_reward_errors(self, step: int, groups: Sequence[Group]) -> None:
        """Groups left out of the step: those whose reward failed, with the failure, to reward_errors.jsonl;
        those none of whose episodes finished: each failed episode to rollouts.jsonl."""
        self._log_failed_episodes(step, groups)
        groups = [group for group in groups if group.reward_error is not None]
        if not groups:
            return
        with self.reward_errors_path.open("a") as f:
            for group in groups:
                record = {"step": step, "problem_id": group.problem.id, "prompt": group.problem.prompt,
                          "answer": group.problem.answer, "error": group.reward_error,
                          "completions": [c.text for c in group.completions]}
                f.write(json.dumps(record) + "\n")

    def _log_failed_episodes(self, step: int, groups: Sequence[Group]) -> None:
        failed = [_failed_episode(step, group, error) for group in groups for error in group.failures or ()]
        if failed:
            with self.rollouts_path.open("a") as f:
                f.writelines(json.dumps(record) + "\n" for record in failed)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def _failed_episode(step: int, group: Group, error: str) -> dict[str, Any]:
    """The rollouts.jsonl line of an episode that failed (Group.failures): its error, no completion."""
    return {"step": step, "problem_id": group.problem.id, "prompt": group.problem.prompt,
            "answer": group.problem.answer, "completion": None, "error": error}


WANDB_ROLLOUT_COLUMNS = ("step", "problem_id", "prompt", "completion", "answer", "reward", "advantage",
                         "num_tokens", "finish_reason")


class WandbTracker:
    """A Weights & Biases run beside the run directory (its files under RUN_DIR/wandb): every metric
    against the training step (W&B's "step" axis, so a resumed run's repeated steps are plotted
    again rather than dropped), the first `rollouts` samples of each step as the "rollouts" table,
    and the config. The run's id is kept in RUN_DIR/wandb_run_id, so a resumed run continues the
    same W&B run."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any], *, project: str, name: str = "",
                 tags: Sequence[str] = (), mode: str = "", rollouts: int = 8):
        import wandb

        self.wandb, self.rollouts = wandb, rollouts
        id_path = run_dir / "wandb_run_id"
        run_id = id_path.read_text().strip() if id_path.exists() else secrets.token_hex(4)
        id_path.write_text(run_id + "\n")
        self.run = wandb.init(project=project, name=name or run_dir.resolve().name, tags=list(tags),
                              config=dict(config), dir=str(run_dir), id=run_id, resume="allow",
                              mode=mode or None)
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log({"step": step, **metrics})

    def log_rollouts(self, step: int, records: Sequence[Mapping[str, Any]]) -> None:
        if not self.rollouts or not records:
            return
        # A prompt given as chat messages goes in as its JSON text.
        rows = [[value if isinstance(value := record[column], (str, int, float)) or value is None else json.dumps(value)
                 for column in WANDB_ROLLOUT_COLUMNS] for record in records[: self.rollouts]]
        self.run.log({"step": step, "rollouts": self.wandb.Table(columns=list(WANDB_ROLLOUT_COLUMNS), data=rows)})

    def finish(self) -> None:
        self.run.finish()


def require_wandb() -> None:
    """Fail before a run starts when run.wandb is asked for and the package is missing."""
    if find_spec("wandb") is None:
        raise ImportError("run.wandb=true needs the wandb package: pip install -e '.[wandb]' in the reasonrl "
                          "checkout (or pip install wandb), or set run.wandb=false")


def show_progress(bar: Any, step: int, metrics: Mapping[str, float], log_every: int) -> None:
    """Advance the progress bar after `step`, showing its reward, accuracy and speed; every
    `log_every` steps also print its main metrics."""
    accuracy = {"acc": f"{metrics[f'reward/{CORRECT}']:.2f}"} if f"reward/{CORRECT}" in metrics else {}
    bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", **accuracy, tok_s=f"{metrics['perf/tokens_per_s']:.0f}")
    bar.update()
    if log_every and step % log_every == 0:
        tqdm.write(format_step(step, metrics))


_CONSOLE_METRICS = ("reward/mean", f"reward/{CORRECT}", "loss/policy", "loss/clip_frac", "kl/mean", "entropy/mean",
                    "rollout/len_mean", "perf/tokens_per_s", "perf/step_s")


def format_step(step: int, metrics: Mapping[str, float], keys: Sequence[str] = _CONSOLE_METRICS) -> str:
    """The printed line of a step: `keys` that the step reported, in that order."""
    shown = "  ".join(f"{key}={metrics[key]:.4g}" for key in keys if key in metrics)
    return f"step {step}: {shown}"


def report_eval(after: dict[str, float] | None, step: int, before: dict[str, float] | None = None) -> None:
    """Print the accuracies and mean rewards of an evaluation at `step` (and their change since `before`)."""
    if not after:
        return
    lines = [f"eval at step {step}:"]
    for key in sorted(k for k in after if k.endswith(("accuracy", "reward_mean"))):
        line = f"  {key}: {after[key]:.3f}"
        if before and key in before:
            line += f"  (before {before[key]:.3f}, change {after[key] - before[key]:+.3f})"
        lines.append(line)
    tqdm.write("\n".join(lines))


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return list(records(path)) if path.exists() else []


def _resume_log(path: Path, step: int) -> None:
    """Cut the log at `path` after `step`, the step a run resumes from, saying so when a log
    written at every step ends before it (lines lost before this resume)."""
    last = truncate_after(path, step)
    # Every stage writes metrics.jsonl; only RL stages write rollouts.jsonl, so its absence says nothing.
    missing = not path.is_file() and path.name == "metrics.jsonl"
    if path.name in _EVERY_STEP and step > 0 and (missing or path.is_file()) and (last is None or last < step):
        ends = "is missing" if missing else "holds no line" if last is None else f"ends at step {last}"
        warn(f"{path} {ends}, but the run resumes from step {step}: the lines of steps {(last or 0) + 1}-{step} "
             "are missing (lost before this resume); the run goes on, and its logs keep the gap")


def _tensorboard_writer(log_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # TensorBoard is optional
        return None
    return SummaryWriter(log_dir=str(log_dir))
