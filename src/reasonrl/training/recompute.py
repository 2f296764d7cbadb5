"""Activation checkpointing of the decoder layers: what an update keeps for its backward pass.

Without it, a decoder layer keeps about 31 KB per token for backward on SmolLM2-135M under
bfloat16 autocast (0.9 GB per 1000 tokens over 30 layers), the float32 norms, casts, rotary
embedding and activation function included; selective keeps about 14 KB, full 2.5 KB (measured
from the live memory after a forward pass). The modes of `train.gradient_checkpointing`:

- off: keep everything.
- full: keep each layer's input and recompute the whole layer in backward (transformers'
  checkpointing): the least memory, a third more matmul work.
- selective: keep the outputs of each layer's matrix products (projections, attention) and
  recompute only the elementwise work between them, which is cheap next to the matmuls
  (torch.utils.checkpoint's selective checkpointing, as Megatron's selective recompute).
- auto (default), by where the model lives:
  - CPU: selective, for micro-batches longer than `train.micro_batch_positions` only (a sequence
    too long to share a packed micro-batch); the others keep everything, as they fit by
    construction. Measured on 2 cores, 2 x 4096 tokens: selective 58.7 s per update against 59.9 s
    keeping everything, full 73.2 s.
  - CUDA: full, for micro-batches whose activations would not fit in half the memory free on the
    device when training starts (KEPT_BYTES per token, layer and hidden unit, measured); the
    others keep everything. On a GPU the recompute is not where the time goes but selective's
    per-op policy is: on an H200, 8 x 1024 tokens, keeping everything took 0.27 s, selective
    0.51 s and full 0.40 s (benchmarks/results/gpu.json).

The per-layer switch is transformers' (`activation_checkpointing_enable`; releases of
transformers 5 before it, 5.17 for one, name it `gradient_checkpointing_enable`);
what is kept is the policy handed to torch's checkpoint, and the length decision is made per call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

MODES = ("auto", "off", "selective", "full")

_aten = torch.ops.aten
# Ops whose outputs a selective checkpoint keeps: the matrix products and fused attention. All
# else in a layer (norms, casts, rotary embedding, SiLU, products, softmax of the matmul
# attention) is recomputed from them in backward.
KEPT_OPS = frozenset({
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default, _aten.matmul.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default, _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default, _aten._scaled_dot_product_cudnn_attention.default,
})


def _keep_matmul_outputs(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in KEPT_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts() -> Any:
    return create_selective_checkpoint_contexts(_keep_matmul_outputs)


# torch checkpoint's arguments for selective recompute (full recompute takes none).
SELECTIVE = {"context_fn": _selective_contexts}


def checkpoint_above(positions: int, selective: bool) -> Callable[..., Any]:
    """A layer checkpoint function: selective or full for hidden states of more than `positions`
    token positions (batch x length), none for shorter ones. A layer given its hidden states by
    keyword (none positional) is always checkpointed."""
    context = SELECTIVE if selective else {}

    def maybe_checkpoint(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], torch.Tensor) and args[0].shape[:-1].numel() <= positions:
            return function(*args, **kwargs)
        return checkpoint(function, *args, use_reentrant=False, **context, **kwargs)
    return maybe_checkpoint


# `auto` without packed micro-batches (train.micro_batch_positions = 0) checkpoints above this on a CPU.
AUTO_POSITIONS_UNPACKED = 2048
# Bytes a decoder layer keeps for backward per token and hidden unit, checkpointing off, bfloat16
# autocast: 31 KB per token and layer for SmolLM2-135M's 576 units on a CPU; 52 on an H200.
KEPT_BYTES = 54
# The share of the device's free memory that auto lets a micro-batch's kept activations take.
AUTO_MEMORY_SHARE = 0.5


def positions_fitting_in_memory(model: Any, free_bytes: int) -> int:
    """The most positions of a micro-batch whose kept activations (checkpointing off) take no
    more than AUTO_MEMORY_SHARE of `free_bytes`."""
    config = model.config.get_text_config()
    per_position = KEPT_BYTES * config.hidden_size * config.num_hidden_layers
    return int(AUTO_MEMORY_SHARE * free_bytes / per_position)


def device_of(model: Any) -> torch.device:
    return next(model.parameters()).device


def auto_checkpoint(model: Any, micro_batch_positions: int) -> Callable[..., Any]:
    """auto's layer checkpoint function for `model` where it lives (see the module docstring)."""
    device = device_of(model)
    if device.type == "cuda":
        free_bytes, _ = torch.cuda.mem_get_info(device)
        return checkpoint_above(positions_fitting_in_memory(model, free_bytes), selective=False)
    return checkpoint_above(micro_batch_positions or AUTO_POSITIONS_UNPACKED, selective=True)


def enable(model: Any, mode: str, micro_batch_positions: int = 0) -> None:
    """Set `model`'s decoder layers to checkpoint as `mode` asks (see the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"activation checkpointing mode {mode!r}; modes: {', '.join(MODES)}")
    if mode == "off" or (mode == "auto" and not getattr(model, "supports_gradient_checkpointing", False)):
        return  # auto asks for nothing a model cannot do; selective or full on such a model fail in transformers
    switch_on = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    switch_on({"use_reentrant": False, **({} if mode == "full" else SELECTIVE)})
    if mode == "auto":
        layer_checkpoint = auto_checkpoint(model, micro_batch_positions)
        for module in model.modules():
            if hasattr(module, "_gradient_checkpointing_func"):
                module._gradient_checkpointing_func = layer_checkpoint
