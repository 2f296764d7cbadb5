"""Saving and resuming a run: policy weights (a loadable HF model directory), optimizer,
scheduler, sampler position and step.

A checkpoint is written into a hidden staging directory and renamed into place, and one is
deleted by renaming it to a hidden name first, so a crash (even kill -9) never leaves a partial
`step_*` directory: only complete checkpoints are ever found. Hidden leftovers of a crash are
removed by the next save (the run directory's lock keeps any other run out, see runs.py).
"""

from __future__ import annotations

import copy
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from reasonrl.models import is_lora

_STEP_DIR = re.compile(r"^step_(\d+)$")


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
    root.mkdir(parents=True, exist_ok=True)
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
        torch.save({"step": step, **state}, staging / "trainer_state.pt")
        if target.exists():
            _delete(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for old in checkpoints(run_dir)[:-keep]:
        _delete(old)
    return target


def _delete(checkpoint: Path) -> None:
    """Hide `checkpoint` from `checkpoints` in one rename, then delete it (a crash leaves it hidden)."""
    hidden = checkpoint.with_name(f".deleting-{checkpoint.name}")
    checkpoint.rename(hidden)
    shutil.rmtree(hidden)


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state on the CPU, wherever it was written: a run trained on a GPU resumes on a
    machine without one (each part's load_state_dict copies into its own device)."""
    return torch.load(checkpoint / "trainer_state.pt", weights_only=False, map_location="cpu")


def load_policy_weights(model: Any, checkpoint: Path) -> None:
    """Copy the checkpoint's trainable weights into `model` in place (the adapters of a LoRA
    policy, else every weight)."""
    from safetensors.torch import load_file

    if is_lora(model):
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_file(checkpoint / "adapter" / "adapter_model.safetensors"))
        if result.unexpected_keys:
            raise RuntimeError(f"checkpoint {checkpoint} has adapters the model lacks: {result.unexpected_keys}")
        return
    state = {}
    for shard in sorted((checkpoint / "policy").glob("*.safetensors")):
        state.update(load_file(shard))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {name for name in missing if name.endswith("lm_head.weight")}
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"checkpoint {checkpoint} does not match the model: missing {sorted(set(missing) - tied)}, "
                           f"unexpected {sorted(unexpected)}")
