"""Saving and resuming a run: policy weights (a loadable HF model directory), optimizer,
scheduler, sampler position and step.

A checkpoint is written into a hidden staging directory and renamed into place, and one is
deleted by renaming it to a hidden name first, so a crash (even kill -9) never leaves a partial
`step_*` directory: only complete checkpoints are ever found. Hidden leftovers of a crash are
removed by the next save (the run directory's lock keeps any other run out, see runs.py).

The last file written into a checkpoint is its manifest (`manifest.json`): the size and SHA-256 of
every other file. `damage` checks them before a resume, so a file cut short, emptied or changed
since (a disk error, a copy gone wrong) is found before anything loads it. Checkpoints written
before manifests are checked only for whole files (each safetensors header covering its file, the
trainer state's zip directory present), and cannot be verified further.

A rename alone orders nothing on disk: after a power loss a renamed checkpoint can hold files cut
to zero bytes. So every file and directory of the staging directory is flushed (fsync) before the
rename, and the parent directory after it: a checkpoint that is found survived the machine too.
"""

from __future__ import annotations

import copy
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from reasonrl.models import is_lora

_STEP_DIR = re.compile(r"^step_(\d+)$")
MANIFEST = "manifest.json"
TRAINER_STATE = "trainer_state.pt"


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message names the file and what to do."""


def checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name)]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = checkpoints(run_dir)
    return found[-1] if found else None


def save_checkpoint(run_dir: str | Path, step: int, *, model: Any, tokenizer: Any, state: dict[str, Any],
                    keep: int = 2) -> Path:
    """Write `run_dir/checkpoints/step_<step>` atomically and drop all but the newest `keep`."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        root.mkdir(parents=True)
        sync_directory(root.parent)
    for stale in [*root.glob(".step_*"), *root.glob(".deleting-*")]:  # left by a process killed mid-save
        shutil.rmtree(stale, ignore_errors=True)
    target = root / f"step_{step:06d}"
    staging = Path(tempfile.mkdtemp(dir=root, prefix=f".step_{step:06d}-"))
    try:
        if is_lora(model):
            model.save_pretrained(staging / "adapter")  # the trainable state, for resuming
            copy.deepcopy(model).merge_and_unload().save_pretrained(staging / "policy")  # for export
        else:
            model.save_pretrained(staging / "policy")
        tokenizer.save_pretrained(staging / "policy")
        torch.save({"step": step, **state}, staging / TRAINER_STATE)
        write_manifest(staging)
        sync_tree(staging)
        if target.exists():
            _delete(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    sync_directory(root)
    for old in checkpoints(run_dir)[:-keep]:
        _delete(old)
    return target


def _delete(checkpoint: Path) -> None:
    """Hide `checkpoint` from `checkpoints` in one rename, then delete it (a crash leaves it hidden)."""
    hidden = checkpoint.with_name(f".deleting-{checkpoint.name}")
    checkpoint.rename(hidden)
    shutil.rmtree(hidden)


def sync_tree(directory: Path) -> None:
    """Flush every file under `directory`, then the directories themselves (deepest first), to disk."""
    paths = sorted(directory.rglob("*"), key=lambda path: len(path.parts), reverse=True)
    for path in paths:
        if path.is_file():
            with path.open("rb") as file:
                os.fsync(file.fileno())
    for path in [*(path for path in paths if path.is_dir()), directory]:
        sync_directory(path)


_NO_DIRECTORY_SYNC = (errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EACCES, errno.EISDIR)
"""What filesystems that cannot flush a directory (some FUSE, network and object-store mounts) answer:
there the names are as durable as the filesystem makes them, and the save goes on."""


def sync_directory(directory: Path) -> None:
    """Flush a directory's entries (the names created or renamed in it), where the filesystem can."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError as exc:
        if exc.errno not in _NO_DIRECTORY_SYNC:
            raise
    finally:
        os.close(descriptor)


def write_manifest(checkpoint: Path) -> None:
    """Record the size and SHA-256 of every file of `checkpoint` in its MANIFEST, written to a
    temporary name and renamed: a manifest is whole or absent."""
    files = {path.relative_to(checkpoint).as_posix(): {"bytes": path.stat().st_size, "sha256": _sha256(path)}
             for path in sorted(checkpoint.rglob("*")) if path.is_file() and path.name != MANIFEST}
    temporary = checkpoint / f".{MANIFEST}.tmp"
    temporary.write_text(json.dumps({"files": files}, indent=1) + "\n")
    os.replace(temporary, checkpoint / MANIFEST)


def has_manifest(checkpoint: Path) -> bool:
    return (checkpoint / MANIFEST).is_file()


def damage(checkpoint: Path) -> str | None:
    """What is wrong with `checkpoint`, naming the file (None: intact): with a manifest, a file
    missing or whose size or SHA-256 differs from when it was written; without one, a file missing
    or not whole (see the module docstring)."""
    if not has_manifest(checkpoint):
        return _unverified_damage(checkpoint)
    manifest = checkpoint / MANIFEST
    try:
        files = {name: (int(entry["bytes"]), str(entry["sha256"]))
                 for name, entry in json.loads(manifest.read_text(encoding="utf-8"))["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"its manifest {manifest} cannot be read ({type(exc).__name__}: {exc})"
    for name, (written_bytes, written_sha256) in files.items():
        path = checkpoint / name
        if not path.is_file():
            return f"{path} is missing"
        if (size := path.stat().st_size) != written_bytes:
            return f"{path} has {size} bytes, {written_bytes} when it was written (cut short or overwritten)"
        if _sha256(path) != written_sha256:
            return f"{path} does not match its SHA-256 in {manifest}: its content changed after it was written"
    return None


def _unverified_damage(checkpoint: Path) -> str | None:
    """A checkpoint without a manifest: its trainer state and weights present and whole."""
    from safetensors import SafetensorError, safe_open

    state = checkpoint / TRAINER_STATE
    if not state.is_file():
        return f"{state} is missing"
    if not zipfile.is_zipfile(state):
        return f"{state} is not a whole torch.save file (cut short or emptied)"
    weights = sorted(checkpoint.glob("*/*.safetensors"))
    if not weights:
        return f"{checkpoint / 'policy'} holds no *.safetensors weights"
    for path in weights:
        try:
            with safe_open(str(path), "pt"):
                pass
        except (SafetensorError, OSError) as exc:
            return f"{path} is not a whole safetensors file ({exc})"
    return None


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def older_checkpoints(checkpoint: Path) -> list[Path]:
    """The run's complete checkpoints before `checkpoint`, oldest first."""
    found = checkpoints(checkpoint.parent.parent)
    return found[: found.index(checkpoint)] if checkpoint in found else found


def set_aside(checkpoint: Path) -> Path:
    """Move a damaged `checkpoint` out of the run's checkpoints (kept beside them, for a look) in one rename."""
    moved = checkpoint.with_name(f"damaged-{checkpoint.name}")
    if moved.exists():
        _delete(moved)
    checkpoint.rename(moved)
    return moved


def fallback_hint(checkpoint: Path) -> str:
    """How to resume from a checkpoint before the damaged `checkpoint`, or that there is none."""
    older = older_checkpoints(checkpoint)
    if not older:
        return ("there is no older checkpoint to fall back to: restore the file from a copy, or start a new run.dir "
                f"(model.name={checkpoint / 'policy'} starts from its weights, if they load)")
    return (f"run.resume=latest_valid resumes from the newest intact older checkpoint ({older[-1].name} is the "
            f"next), setting {checkpoint.name} aside as damaged-{checkpoint.name}")


def _loading(checkpoint: Path, path: Path, exc: Exception) -> CheckpointError:
    older = older_checkpoints(checkpoint)
    fix = (f"to resume from {older[-1].name}, move it aside (mv {checkpoint} {checkpoint.parent}/damaged-"
           f"{checkpoint.name}) and resume again" if older else "there is no older checkpoint to fall back to")
    return CheckpointError(f"{path} of checkpoint {checkpoint} cannot be loaded ({type(exc).__name__}: {exc}); {fix}")


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state on the CPU, wherever it was written: a run trained on a GPU resumes on a
    machine without one (each part's load_state_dict copies into its own device)."""
    path = checkpoint / TRAINER_STATE
    try:
        return torch.load(path, weights_only=False, map_location="cpu")
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise _loading(checkpoint, path, exc) from exc


def load_policy_weights(model: Any, checkpoint: Path) -> None:
    """Copy the checkpoint's trainable weights into `model` in place (the adapters of a LoRA
    policy, else every weight)."""
    if is_lora(model):
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, _load_weights(checkpoint, checkpoint / "adapter" /
                                                                "adapter_model.safetensors"))
        if result.unexpected_keys:
            raise RuntimeError(f"checkpoint {checkpoint} has adapters the model lacks: {result.unexpected_keys}")
        return
    state = {}
    for shard in sorted((checkpoint / "policy").glob("*.safetensors")):
        state.update(_load_weights(checkpoint, shard))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {name for name in missing if name.endswith("lm_head.weight")}
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"checkpoint {checkpoint} does not match the model: missing {sorted(set(missing) - tied)}, "
                           f"unexpected {sorted(unexpected)}")


def _load_weights(checkpoint: Path, path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except (SafetensorError, OSError) as exc:
        raise _loading(checkpoint, path, exc) from exc
