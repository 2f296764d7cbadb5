"""A checkpoint as a model for other tools: transformers, vLLM, PEFT, the Hugging Face hub.

A checkpoint (`RUN_DIR/checkpoints/step_N`) is made for resuming: the policy in float32, the
optimizer's state (twice the weights again), and for a LoRA run the adapters beside the merged
policy. `export_checkpoint` writes the policy alone in the dtype asked for (bfloat16 halves the
float32 weights), with its tokenizer and a model card naming the run's settings; for a LoRA run,
the merged model or the adapters alone (`adapter=True`, loadable with peft on the base model).
The checkpoint is verified against its manifest first. `push_to_hub` uploads the exported folder
with huggingface_hub, which needs network access and a token (`huggingface-cli login` or HF_TOKEN).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from reasonrl.training.checkpoint import CheckpointError, damage, latest_checkpoint, sync_directory, sync_tree
from reasonrl.training.jsonl import RunFileError, records

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


class ExportError(ValueError):
    """What cannot be exported as asked; the message says why and what to give instead."""


def resolve_checkpoint(path: str | Path) -> Path:
    """`path` itself when it is a checkpoint, else the newest checkpoint of the run directory `path`."""
    path = Path(path)
    if (path / "policy").is_dir():
        return path
    if (path / "config.toml").is_file():
        newest = latest_checkpoint(path)
        if newest is None:
            raise ExportError(f"the run {path} has no checkpoint yet (run.save_every, or the end of the run, writes one)")
        return newest
    raise ExportError(f"{path} is neither a checkpoint (RUN_DIR/checkpoints/step_N, holding policy/) nor a run "
                      "directory")


def export_checkpoint(checkpoint: str | Path, out: str | Path, *, dtype: str = "bfloat16",
                      adapter: bool = False) -> Path:
    """Write the policy of `checkpoint` (or of a run directory's newest one) to the new or empty
    directory `out` in `dtype`, with its tokenizer and a model card; the adapters alone with
    `adapter` (a LoRA run's). The directory written."""
    if dtype not in DTYPES:
        raise ExportError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    source = resolve_checkpoint(checkpoint)
    if problem := damage(source):
        raise CheckpointError(f"{source} is damaged, not exported: {problem}")
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ExportError(f"{target} exists and is not an empty directory: give a new --out")
    if adapter and not (source / "adapter").is_dir():
        raise ExportError(f"{source} holds no adapters: it is a full fine-tuning checkpoint (train.lora_rank=0); "
                          "export the whole policy (without --adapter)")
    staging = target.with_name(f".{target.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        if adapter:
            _write_adapter(source, staging, DTYPES[dtype])
        else:
            _write_policy(source, staging, DTYPES[dtype])
        (staging / "README.md").write_text(model_card(source, dtype=dtype, adapter=adapter))
        sync_tree(staging)
        if target.exists():
            target.rmdir()
        staging.rename(target)  # whole or absent: a crash leaves only the hidden staging directory
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    sync_directory(target.parent)
    return target


def _write_policy(source: Path, out: Path, dtype: torch.dtype) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(source / "policy", dtype=dtype)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(source / "policy").save_pretrained(out)


def _write_adapter(source: Path, out: Path, dtype: torch.dtype) -> None:
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer

    out.mkdir(parents=True)
    shutil.copy2(source / "adapter" / "adapter_config.json", out / "adapter_config.json")
    weights = load_file(source / "adapter" / "adapter_model.safetensors")
    save_file({name: tensor.to(dtype) if tensor.is_floating_point() else tensor for name, tensor in weights.items()},
              out / "adapter_model.safetensors", metadata={"format": "pt"})
    AutoTokenizer.from_pretrained(source / "policy").save_pretrained(out)


def model_card(checkpoint: Path, *, dtype: str, adapter: bool) -> str:
    """A README naming what was trained: the base model, the settings, the step, the last evaluation."""
    from reasonrl.config.loading import read_toml
    from reasonrl.report.settings import settings_of

    run_dir = checkpoint.parent.parent
    config: dict[str, Any] = read_toml(run_dir / "config.toml") if (run_dir / "config.toml").is_file() else {}
    base = config.get("model", {}).get("name", "unknown")
    trained = f"Trained with reasonrl from `{base}`: {settings_of(config).describe()}." if config else \
        "Trained with reasonrl."
    what = "the LoRA adapters (load them with peft on the base model)" if adapter else "the policy"
    lines = ["---", "library_name: " + ("peft" if adapter else "transformers"), f"base_model: {base}",
             "tags: [reasonrl, reinforcement-learning]", "---", "", f"# {run_dir.name}, {checkpoint.name}", "",
             trained, "", f"Exported as {what} in {dtype}."]
    evaluation = _last_evaluation(run_dir)
    if evaluation:
        lines += ["", "Held-out evaluation at the run's last evaluation step:", "",
                  *(f"- {key}: {value:.4g}" for key, value in evaluation.items())]
    return "\n".join(lines) + "\n"


def _last_evaluation(run_dir: Path) -> dict[str, float]:
    path = run_dir / "metrics.jsonl"
    last: dict[str, float] = {}
    try:
        for record in records(path, cut_off=lambda message: None) if path.is_file() else ():
            if "eval/greedy_accuracy" in record:
                last = {key: value for key, value in record.items() if key.endswith("_accuracy")}
    except RunFileError:
        pass  # a damaged log costs the card its evaluation, not the export
    return last


def push_to_hub(folder: str | Path, repo_id: str, *, private: bool = False, token: str | None = None) -> str:
    """Upload an exported `folder` to the hub repository `repo_id` (created when missing); its URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    api.upload_folder(folder_path=str(folder), repo_id=repo_id, commit_message="Upload a model trained with reasonrl")
    return f"https://huggingface.co/{repo_id}"
