"""A run's directory and how every training command (`train`, `sft`, `dpo`, `rft`) starts and opens
it: where it resumes from (a run directory that holds checkpoints is never overwritten), its device
and seed, which stateful parts it restores and saves, its saved config and its logger. What happens
around each step (progress, checkpoints, budgets) is reasonrl.training.skeleton.

One run at a time per directory: a run holds an exclusive lock on `RUN_DIR/.lock` (flock; a run
that ends removes the file and releases it, and the kernel releases it when a process dies
however it dies) and a second run on the same directory fails at once, naming the holder. A `run.dir` with time placeholders (the default `runs/%Y%m%d-%H%M%S`) names a
new directory for each run: two runs started in the same second get `NAME` and `NAME-2`.

A resume (`run.resume`) is refused before anything is built when it would splice two runs or
lose data: a config that differs from RUN_DIR/config.toml (or that file missing), a key that no
resume can change (RESUME_FIXED), a damaged newest checkpoint (checkpoint.damage; `latest_valid`
falls back to the newest intact one instead). Its logs are then cut at the checkpoint's step in
place (reasonrl.training.jsonl), and the optimizer settings it was given take effect on the
restored optimizer (the learner applies its own settings over a restored state).
"""

from __future__ import annotations

import fcntl
import itertools
import os
import socket
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import torch

from reasonrl.config import Config, ConfigError, load_config
from reasonrl.models import cpu_dtype_note, pick_device
from reasonrl.training.checkpoint import (
    CheckpointError,
    checkpoints,
    damage,
    fallback_hint,
    has_manifest,
    latest_checkpoint,
    load_trainer_state,
    set_aside,
)
from reasonrl.training.cpu_share import CpuShare
from reasonrl.training.jsonl import RunFileError, warn
from reasonrl.training.logging import RunLogger, WandbTracker, require_wandb


class RunDirInUseError(RuntimeError):
    """Another run holds the run directory."""


class RunDirPathError(ValueError):
    """run.dir names something that cannot be a run directory (a file)."""


class ResumeConfigError(ValueError):
    """A resume whose config differs from the one the run was started with."""


class NoCheckpointError(FileNotFoundError):
    """run.resume with no checkpoint in run.dir."""


class CheckpointsExistError(FileExistsError):
    """A new run in a run.dir that already holds checkpoints."""


# The errors of a run that cannot start or resume as asked: each message names the cause and the
# fix, so the command line prints it alone, without a traceback.
RUN_START_ERRORS = (RunDirInUseError, RunDirPathError, ResumeConfigError, NoCheckpointError, CheckpointsExistError,
                    CheckpointError, RunFileError)


def resuming(cfg: Config) -> bool:
    return cfg.run.resume != "off"


class RunLock:
    """The exclusive lock on a run directory: held while this object lives (or until `release`)."""

    def __init__(self, path: Path, file: IO[str]) -> None:
        self.path, self._file = path, file

    def release(self) -> None:
        """Remove the lock file and release the lock: a finished run leaves no `.lock` behind. The
        file goes first, while the lock is still held, and a process that locks it later checks it
        still has a name (lock_run_dir), so no two runs ever hold the directory."""
        if self._file.closed:
            return
        try:
            if os.stat(self.path).st_ino == os.fstat(self._file.fileno()).st_ino:
                self.path.unlink()
        except FileNotFoundError:
            pass
        self._file.close()  # closing the last descriptor of the lock releases it


def make_run_dir(run_dir: Path) -> None:
    """Make `run_dir` (and its parents) if missing; RunDirPathError when a file stands in the way."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocking = next((p for p in (run_dir, *run_dir.parents) if p.exists() and not p.is_dir()), run_dir)
        raise RunDirPathError(f"run.dir {run_dir} cannot be a directory: {blocking} is a file; choose another "
                              "run.dir (or move the file)") from None


def lock_run_dir(run_dir: Path) -> RunLock:
    """Lock `run_dir` (made if missing) for this process; RunDirInUseError naming the holder if taken."""
    make_run_dir(run_dir)
    path = run_dir / ".lock"
    while True:
        file = path.open("a+")
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.seek(0)
            holder = file.read().strip() or "a process that has not yet written its pid"
            file.close()
            this = " (this process: a run is already open here)" if holder.startswith(f"pid {os.getpid()} ") else ""
            raise RunDirInUseError(f"run.dir {run_dir} is in use by another run, {holder}{this}: wait for it to end "
                                   "or stop it, or choose another run.dir") from None
        try:
            if os.stat(path).st_ino == os.fstat(file.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        file.close()  # locked a file its holder removed as it finished: lock the one that has the name
    file.seek(0)
    file.truncate()
    file.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    file.flush()
    return RunLock(path, file)


def claim_run_dir(template: str, resume: bool) -> Path:
    """`template` with its time placeholders filled in. A template with placeholders names a new
    directory (made here, with -2, -3... when the name is taken) unless the run resumes; a plain
    path is used as it is (the lock keeps two runs out of it)."""
    name = time.strftime(template)
    if name == template or resume:
        return Path(name)
    make_run_dir(Path(name).parent)
    for attempt in itertools.count(1):
        candidate = Path(name if attempt == 1 else f"{name}-{attempt}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class RunStart:
    """A run about to build its parts: its config (run.dir's time placeholders filled in), its
    directory and the lock on it (held as long as this object lives), the checkpoint it resumes
    from, its device, its share of the CPU cores."""

    cfg: Config
    run_dir: Path
    resume_from: Path | None
    device: torch.device
    lock: RunLock | None = None
    cpu: CpuShare | None = None

    def release(self) -> None:
        """Release the run directory (its `.lock` goes) and this run's share of the CPU cores."""
        if self.lock is not None:
            self.lock.release()
        if self.cpu is not None:
            self.cpu.leave()


def start_run(cfg: Config) -> RunStart:
    """Claim and lock run.dir, find the checkpoint to resume from, pick the device and seed torch."""
    run_dir = claim_run_dir(cfg.run.dir, resuming(cfg))
    cfg = replace(cfg, run=replace(cfg.run, dir=str(run_dir)))
    lock = lock_run_dir(run_dir)
    try:
        if cfg.run.wandb:
            require_wandb()
        resume_from = checkpoint_to_resume(cfg)
        device = pick_device(cfg.run.device)
    except BaseException:
        lock.release()  # not left to the traceback's lifetime
        raise
    if note := cpu_dtype_note(device, {"train.dtype": cfg.train.dtype, "rollout.dtype": cfg.rollout.dtype}):
        warn(note)
    torch.manual_seed(cfg.run.seed)
    cpu = CpuShare(cfg.run.threads).join()  # before any model loads: loading runs on these threads too
    return RunStart(cfg=cfg, run_dir=run_dir, resume_from=resume_from, device=device, lock=lock, cpu=cpu)


def open_run(start: RunStart, stateful: Mapping[str, Any], ref_model: Any = None) -> tuple[int, RunLogger]:
    """Restore the stateful parts, save the config in the run directory and open its logger; the
    step to continue from (0 for a new run) and the logger."""
    step = restore_state(start.resume_from, stateful, ref_model)
    start.run_dir.mkdir(parents=True, exist_ok=True)
    save_config(start.cfg, start.run_dir / "config.toml")
    r = start.cfg.run
    tracker = WandbTracker(start.run_dir, start.cfg.to_dict(), project=r.wandb_project, name=r.wandb_name,
                           tags=r.wandb_tags, mode=r.wandb_mode, rollouts=r.wandb_rollouts) if r.wandb else None
    logger = RunLogger(start.run_dir, tensorboard=r.tensorboard, resume_step=step if start.resume_from else None,
                       wandb=tracker)
    return step, logger


def save_config(cfg: Config, path: Path) -> None:
    """Write `cfg` to `path` through a temporary file and a rename: a kill leaves the old file or the new one."""
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    os.close(descriptor)
    try:
        cfg.save(temporary)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


# Keys a resumed run may change without mixing two runs: how long it trains, what it evaluates and
# logs, and its guards. Any other change is refused unless run.resume_override.
RESUME_MAY_CHANGE = frozenset({
    "train.steps", "train.max_minutes", "train.max_generated_tokens", "run.dir", "run.resume", "run.resume_override", "run.save_every",
    "run.threads", "run.save_optimizer",
    "run.keep_checkpoints", "run.tensorboard", "run.progress", "run.log_every", "run.alarms", "run.stop_on",
    "run.hang_factor", "run.hang_floor_s", "run.sync_check", "run.sync_max_gap", "run.sync_probe_prompts",
    "run.sync_probe_tokens"})
MAY_CHANGE_SECTIONS = ("eval.", "alarm.")
# Keys no resume can change, run.resume_override or not: the checkpoint fixes them.
RESUME_FIXED = {
    "model.name": "the policy's weights come from the checkpoint; another name would change only the tokenizer "
                  "and the reference model",
    "train.lora_rank": "the checkpoint holds the weights (or adapters) of the rank the run was started with",
    "algo.kl_coef": "the KL coefficient is part of the restored state (and a reference model is built only for a "
                    "coefficient above 0)",
    "critic.model": "the critic's weights come from the checkpoint",
    "run.learner_shard": "the optimizer state in the checkpoint is sharded, or not, as the run was",
    "train.optimizer_state": "the optimizer state in the checkpoint is stored in float32 or 8 bits as the run was",
}


def changed_keys(saved: Config, cfg: Config) -> dict[str, tuple[Any, Any]]:
    """The dotted keys whose values differ between `saved` and `cfg`: (saved value, new value)."""
    old, new = saved.to_dict(), cfg.to_dict()
    return {f"{section}.{key}": (old[section].get(key), value) for section, values in new.items()
            for key, value in values.items() if old.get(section, {}).get(key) != value}


def check_resume_config(cfg: Config, run_dir: Path) -> None:
    """Refuse to resume `run_dir` with a config that trains differently from the one it was started
    with (RUN_DIR/config.toml, which must exist), naming the keys; run.resume_override=true resumes
    anyway, except with a change of a RESUME_FIXED key."""
    path = run_dir / "config.toml"
    if not path.is_file():
        if cfg.run.resume_override:
            print(f"run.resume_override: resuming {run_dir} without its config.toml: the config given is taken "
                  "as the one it was run with", flush=True)
            return
        raise ResumeConfigError(f"{path} is missing: a resume is checked against the config the run was started "
                                "with. Resume with that config and run.resume_override=true (the config given is "
                                "then taken as the run's), or start a new run.dir")
    try:
        saved = load_config(path)
    except ConfigError as exc:
        if cfg.run.resume_override:
            return
        raise ResumeConfigError(f"{path} cannot be read as a config of this version ({exc}): set "
                                "run.resume_override=true to resume with the config given") from None
    changed = {key: values for key, values in changed_keys(saved, cfg).items()
               if key not in RESUME_MAY_CHANGE and not key.startswith(MAY_CHANGE_SECTIONS)}
    if not changed:
        return
    if fixed := [key for key in changed if key in RESUME_FIXED]:
        raise ResumeConfigError("; ".join(f"{key} cannot change on resume ({changed[key][0]!r} -> "
                                          f"{changed[key][1]!r}): {RESUME_FIXED[key]}" for key in fixed)
                                + f". Resume with the value in {path}, or start a new run.dir (model.name="
                                f"{latest_checkpoint(run_dir) / 'policy'} starts from the checkpoint's weights)")
    listed = ", ".join(f"{key} ({old!r} -> {new!r})" for key, (old, new) in changed.items())
    if cfg.run.resume_override:
        print(f"run.resume_override: resuming {run_dir} with a changed config: {listed}", flush=True)
        return
    raise ResumeConfigError(f"run.resume=true, but the config differs from the one {run_dir} was run with "
                            f"({path}): {listed}. A resumed run with other settings is two runs spliced together; "
                            "resume with the saved config, start a new run.dir, or set run.resume_override=true")


def already_complete(start: RunStart, steps: int) -> bool:
    """Whether `start` resumes from a checkpoint at `steps` or later, saying so: a finished run is
    not trained again (zero steps, silently), it is reported complete."""
    if start.resume_from is None:
        return False
    done = checkpoint_step(start.resume_from)
    if done < steps:
        return False
    print(f"run {start.run_dir} is already complete: its checkpoint {start.resume_from.name} reached train.steps="
          f"{steps}; nothing to do (raise train.steps to train it further)", flush=True)
    return True


def checkpoint_step(checkpoint: Path) -> int:
    return int(checkpoint.name.removeprefix("step_"))


def checkpoint_to_resume(cfg: Config) -> Path | None:
    """The checkpoint a run resumes from (None: a new run), its config checked against the run's
    and its files against its manifest; see the module docstring."""
    run_dir = Path(cfg.run.dir)
    if not resuming(cfg):
        if checkpoints(run_dir):
            raise CheckpointsExistError(f"{run_dir} already holds checkpoints: continue it with run.resume=true, "
                                        "or choose a new run.dir")
        return None
    found = latest_checkpoint(run_dir)
    if found is None:
        raise NoCheckpointError(f"run.resume={cfg.run.resume} but {run_dir} has no checkpoint to resume from")
    check_resume_config(cfg, run_dir)
    return intact_checkpoint(found, fall_back=cfg.run.resume == "latest_valid")


def intact_checkpoint(newest: Path, *, fall_back: bool) -> Path:
    """`newest` when its files are intact, else (`fall_back`) the newest intact older checkpoint,
    the damaged ones set aside with a warning; a CheckpointError naming the damage otherwise."""
    checkpoint: Path | None = newest
    while (found := damage(checkpoint)) is not None:
        if not fall_back:
            raise CheckpointError(f"checkpoint {checkpoint} is damaged: {found}; {fallback_hint(checkpoint)}")
        warn(f"checkpoint {checkpoint} is damaged: {found}; set aside as {set_aside(checkpoint)}")
        checkpoint = latest_checkpoint(checkpoint.parent.parent)
        if checkpoint is None:
            raise CheckpointError(f"run.resume=latest_valid found no intact checkpoint in {newest.parent} (the "
                                  "damaged ones are set aside as damaged-step_*): start a new run.dir")
    if not has_manifest(checkpoint):
        warn(f"checkpoint {checkpoint} was written without checksums (by an older reasonrl): its files are whole, "
             "but their content cannot be verified")
    return checkpoint


def trainer_state(stateful: Mapping[str, Any], ref_model: Any = None, *, optimizer: bool = True) -> dict[str, Any]:
    """The state of every stateful part (None parts left out), and of a reference model that was
    reset to a past policy (not reproducible from the config). Without `optimizer`
    (run.save_optimizer=false) the optimizers' states are left out: the checkpoint holds the
    weights and everything else a resume needs, and a resume restarts the optimizer's moments."""
    state = {name: part.state_dict() for name, part in stateful.items() if part is not None}
    if ref_model is not None:
        state["reference"] = ref_model.state_dict()
    if not optimizer:
        state = {**_without_optimizers(state), "optimizer_saved": False}
    return state


def _without_optimizers(state: Any) -> Any:
    """`state` without any "optimizer" entry, at any depth (a critic's learner holds one too)."""
    if not isinstance(state, Mapping):
        return state
    return {key: _without_optimizers(value) for key, value in state.items() if key != "optimizer"}


def restore_state(resume_from: Path | None, stateful: Mapping[str, Any], ref_model: Any = None) -> int:
    """The step to continue from (0 for a new run), with every stateful part restored."""
    if resume_from is None:
        return 0
    state = load_trainer_state(resume_from)
    for name, part in stateful.items():
        # Older checkpoints: a fixed KL coefficient, no token count, no tree sampler state; synchronous
        # runs: no rollouts in flight.
        if part is None or (name in ("kl_coef", "pipeline", "generated_tokens", "tree_sampler") and name not in state):
            continue
        if name not in state:
            raise ValueError(f"{resume_from} holds no {name} state: it was written with another algorithm config")
        part.load_state_dict(state[name])
    if "reference" in state:
        ref_model.load_state_dict(state["reference"])
    print(f"resuming from checkpoint {resume_from} (step {state['step']})", flush=True)
    if state.get("optimizer_saved") is False:
        print("the checkpoint holds no optimizer state (it was written with run.save_optimizer=false): the "
              "optimizer's moments start again from zero, so the run does not continue exactly as it would have",
              flush=True)
    return state["step"]
