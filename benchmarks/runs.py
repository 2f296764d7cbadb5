"""Training runs as benchmark data points: one `reasonrl train` in a fresh process per run, its
metrics kept as a JSON record, and records reused across invocations.

A record (`benchmarks/results/<study>/<name>.json`) holds the arguments it ran with, the commit,
the digest of the library's files (`source`), the wall time, the held-out evaluation at the end and
the per-step curves. Running a study again skips every run whose record exists with the same
arguments, so a long study can be stopped and continued (in another session, on another day) and
a changed setting reruns only what it changes. A default of `reasonrl train` that changed counts as
a changed setting (`CHANGED_DEFAULTS`): a record made before the change stands for a run that pins
the old value, not for one that takes the new. Records of an older commit are kept and marked by
their `commit` field, and each names the device it ran on. `run_all` runs several at a time, for a
machine that one small run leaves mostly idle (a GPU, many cores).
"""

from __future__ import annotations

import collections
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import code_version, cpu_model, source_digest
from reasonrl.allocator import library_to_preload, preloaded_allocator
from reasonrl.training.checkpoint import latest_checkpoint

RESULTS = Path(__file__).parent / "results"

# Per-step metrics kept in every record (when the run logs them).
CURVE_KEYS = ("reward/mean", "reward/correct", "entropy/mean", "rollout/len_mean", "rollout/len_correct_mean",
              "rollout/len_wrong_mean", "rollout/truncated_frac", "rollout/zero_std_frac", "loss/clip_frac",
              "loss/ratio_mean", "loss/ratio_max", "kl/mean", "train/grad_norm", "perf/step_s", "perf/generate_s",
              "sampling/rounds", "sampling/dropped_groups", "rollout/generated_tokens", "distill/reverse_kl",
              "distill/teacher_logp", "rollout/idle_slot_frac", "rollout/paused", "async/token_staleness_mean",
              "async/partial_frac", "async/wait_s")
QUIET = ["run.progress=false", "run.tensorboard=false", "run.log_every=0", "run.save_every=0"]
STDERR_TAIL_LINES = 20  # of a failed run's stderr, in the error that names it


@dataclass(frozen=True)
class ChangedDefault:
    """A default of `reasonrl train` that changed in `commit`: a run on the defaults (no recipe file)
    recorded before that commit, without setting `key`, ran with `before`."""

    key: str
    before: str
    after: str
    commit: str
    training_only: bool = True  # an evaluation alone (train.steps=0) is the same under either value


# The recipes' files pin these keys (tests/unit/test_changed_defaults.py), so only the defaults move.
CHANGED_DEFAULTS = (ChangedDefault("sampling.mask_truncated", "false", "true", "43f9aaa"),)
# The defaults as the studies measured before those changes had them: a study that puts these first
# in its arguments keeps its records, and its new seeds run as its old ones did.
AS_MEASURED = tuple(f"{changed.key}={changed.before}" for changed in CHANGED_DEFAULTS)


class RunFailed(RuntimeError):
    """A run's process exited with an error; the message ends with the last lines of its stderr."""


def run_command(command: Sequence[str], env: dict[str, str] | None = None) -> None:
    """Run `command`, passing its stderr through as it comes; when it fails, raise `RunFailed` with
    the last lines of that stderr, so the cause (a CUDA out-of-memory error, a bad override) is named
    where `run_all` lists the failures, not only somewhere in several runs' interleaved output."""
    tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
    with subprocess.Popen(list(command), env=env, stderr=subprocess.PIPE, text=True, errors="replace") as process:
        assert process.stderr is not None
        for line in process.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            tail.append(line)
    if process.returncode:
        raise RunFailed(f"exit status {process.returncode}; the end of its stderr:\n{''.join(tail).rstrip()}")


def plain_name(name: str) -> bool:
    """Letters, digits and _ only, and not empty: safe as a file or folder name under results/."""
    return name.replace("_", "").isalnum()


def record_path(study: str, name: str) -> Path:
    return RESULTS / study / f"{name}.json"


def read_record(study: str, name: str) -> dict[str, Any]:
    return json.loads(record_path(study, name).read_text())


def run_device() -> str:
    """Where a run started here trains (`run.device=auto`): the first GPU's name, else the CPU's with
    its vector units and the dtype `train.dtype=auto` updates in there, since CPUs of one name
    differ in whether bfloat16 is native (e.g. "cpu: AMD EPYC 9R14 (AVX2, float32)")."""
    import torch

    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)}"
    from reasonrl.models import resolve_dtype

    dtype = str(resolve_dtype("auto", torch.device("cpu"))).removeprefix("torch.")
    return f"cpu: {cpu_model()} ({torch.backends.cpu.get_cpu_capability()}, {dtype})"


def git_commit(describe: str) -> str | None:
    """The commit a `code_version()` string names ("f261190", "v1-3-gf261190-dirty"), or None."""
    name = describe.removesuffix("-dirty").rpartition("-g")[2]
    return name if name and all(c in "0123456789abcdef" for c in name) else None


@functools.cache
def is_strict_ancestor(older: str, newer: str) -> bool | None:
    """Whether commit `older` comes before `newer` in this checkout's history (None: unknown here)."""
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(Path(__file__).parent), *args], capture_output=True, text=True,
                              check=False)

    resolved = [run("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}") for name in (older, newer)]
    if any(r.returncode for r in resolved):
        return None
    if resolved[0].stdout == resolved[1].stdout:
        return False
    return run("merge-base", "--is-ancestor", older, newer).returncode == 0


def predates(describe: str, change: str) -> bool:
    """Whether a record made at `describe` (a `code_version()` string) ran without commit `change`:
    its commit came before; for a tree with uncommitted changes, before `change`'s parent (edits on
    top of the parent may have been the change itself). Unknown counts as not before."""
    commit = git_commit(describe)
    if commit is None:
        return False
    newest_clean = f"{change}^" if describe.endswith("-dirty") else change
    return bool(is_strict_ancestor(commit, newest_clean))


def effective_args(config: str | None, args: Sequence[str], commit: str | None = None) -> list[str]:
    """`args` with every changed default's key set once, at the end, to the value the run had: made at
    `commit` (a record's), or now (None). Runs of a recipe file, and evaluations alone where the key
    only touches training, are left as they are."""
    if config is not None:
        return list(args)
    effective = list(args)
    for changed in CHANGED_DEFAULTS:
        if changed.training_only and "train.steps=0" in args:
            continue
        prefix = f"{changed.key}="
        set_to = [arg.removeprefix(prefix) for arg in args if arg.startswith(prefix)]
        value = set_to[-1] if set_to else (
            changed.before if commit is not None and predates(commit, changed.commit) else changed.after)
        effective = [arg for arg in effective if not arg.startswith(prefix)] + [prefix + value]
    return effective


def same_run(record: dict[str, Any], config: str | None, args: Sequence[str]) -> bool:
    """Whether `record` stands for `reasonrl train [config] args...` run now."""
    return record.get("config") == config and effective_args(
        config, record.get("args", []), record.get("commit", "unknown")) == effective_args(config, args)


def run_environment(*, threads: int | None = None, allocator: str | None = None) -> tuple[dict[str, str] | None,
                                                                                     str | None]:
    """The environment of a benchmark's child run, and the library it preloads: `threads` sets
    OMP_NUM_THREADS; `allocator` preloads the malloc `make train ALLOCATOR=...` would (auto, glibc,
    tcmalloc, mimalloc; `reasonrl.allocator`), whatever this process has. (None, None) when neither
    is given: the child inherits this process's environment as it is."""
    env = None if threads is None else {**os.environ, "OMP_NUM_THREADS": str(threads)}
    if allocator is None:
        return env, None
    if allocator == "auto" and preloaded_allocator() is not None:
        # auto leaves a caller's preload standing, so here it would name none: not make train's choice
        raise ValueError("allocator='auto' picks what make train would preload from a plain environment: "
                         "run this without LD_PRELOAD")
    preloaded = library_to_preload(allocator)
    return {**(env or os.environ), "LD_PRELOAD": preloaded or ""}, preloaded


def train_run(study: str, name: str, config: str | None, args: Sequence[str], *, rerun: bool = False,
              extra: dict[str, Any] | None = None, keep_in: Path | None = None,
              threads: int | None = None, allocator: str | None = None) -> dict[str, Any]:
    """The record of `reasonrl train [config] args...`, from disk when it ran before with the same
    arguments, else run now and written. The run directory is temporary, or `keep_in` for a run whose
    final checkpoint other runs use (e.g. a distillation teacher): reused only while it holds one.
    `threads` and `allocator` set its environment (`run_environment`)."""
    path = record_path(study, name)
    wanted = {"config": config, "args": list(args)}
    if path.exists() and not rerun:
        record = json.loads(path.read_text())
        kept = keep_in is None or latest_checkpoint(keep_in) is not None
        if same_run(record, config, args) and kept and record.get("allocator", {}).get("choice") == allocator:
            return record
    print(f"[{study}] {name}: reasonrl train {config or ''} {' '.join(args)}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix=f"{study.replace('/', '_')}_") as scratch:
        run_dir = Path(scratch) / "run"
        if keep_in is not None:
            shutil.rmtree(keep_in, ignore_errors=True)  # a stale or partial run there would be resumed
            run_dir = keep_in
        command = [sys.executable, "-m", "reasonrl.commands.cli", "train", *([config] if config else []),
                   f"run.dir={run_dir}", *QUIET, *args]
        env, preloaded = run_environment(threads=threads, allocator=allocator)
        # Taken as the run starts: an edit to the tree while it trains must not be credited to it.
        identity = {"commit": code_version(), "source": source_digest()}
        started = time.perf_counter()
        run_command(command, env=env)
        wall_s = time.perf_counter() - started
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    chosen = {} if allocator is None else {"allocator": {"choice": allocator, "preloaded": preloaded}}
    record = {**wanted, **identity, "device": run_device(), "wall_s": wall_s, **chosen, **(extra or {}),
              **summarize_metrics(metrics)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return record


@dataclass(frozen=True)
class RunSpec:
    """One `train_run`, to be run later (by `run_all`)."""

    study: str
    name: str
    config: str | None
    args: tuple[str, ...]
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    allocator: str | None = None  # train_run's

    def run(self, *, rerun: bool = False, threads: int | None = None) -> dict[str, Any]:
        """Its record (`train_run`): from disk when it ran with the same arguments, else run now."""
        return train_run(self.study, self.name, self.config, self.args, rerun=rerun, extra=self.extra,
                         threads=threads, allocator=self.allocator)


def run_all(specs: Sequence[RunSpec], jobs: int = 1, *, rerun: bool = False,
            start_within_s: float | None = None) -> list[RunSpec]:
    """Every spec's record, running up to `jobs` at a time (each in its own process, with
    cores / jobs CPU threads). A failed run does not stop the others; the failures are raised
    together once every run has ended. With `start_within_s`, no run starts after that many seconds
    (those already going finish), so a machine lent for a fixed time ends with whole runs, not runs
    killed halfway; the specs left unstarted are returned (and listed on stderr)."""
    threads = None if jobs <= 1 else max(1, (os.cpu_count() or 1) // jobs)
    deadline = None if start_within_s is None else time.monotonic() + start_within_s

    def run_unless_late(spec: RunSpec) -> bool:
        if deadline is not None and time.monotonic() >= deadline:
            return False
        spec.run(rerun=rerun, threads=threads)
        return True

    failures: list[str] = []
    unstarted: list[RunSpec] = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for spec, future in [(spec, pool.submit(run_unless_late, spec)) for spec in specs]:
            if (error := future.exception()) is not None:
                failures.append(f"{spec.study}/{spec.name}: {error}")
            elif not future.result():
                unstarted.append(spec)  # in the specs' order, whichever worker reached it
    if unstarted:
        print(f"{len(unstarted)} of {len(specs)} runs not started (past {start_within_s:g} s): "
              + ", ".join(f"{spec.study}/{spec.name}" for spec in unstarted), file=sys.stderr, flush=True)
    if failures:
        raise RuntimeError(f"{len(failures)} of {len(specs)} runs failed:\n" + "\n".join(failures))
    return unstarted


def summarize_metrics(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """The evaluations (by step) and the per-step curves of a run's metrics.jsonl lines."""
    steps = [m for m in metrics if "perf/step_s" in m]
    evals = [{k: v for k, v in m.items() if k == "step" or k.startswith("eval/")}
             for m in metrics if any(k.startswith("eval/") for k in m)]
    curves = {key: [m.get(key) for m in steps] for key in CURVE_KEYS if any(key in m for m in steps)}
    alarms = sorted({key.removeprefix("alarm/") for m in steps for key, value in m.items()
                     if key.startswith("alarm/") and value})
    return {"steps": len(steps), "evals": evals, "eval_last": evals[-1] if evals else None, "curves": curves,
            "alarms": alarms}
