"""The AdamW a learner steps, by how it stores its two moments (`train.optimizer_state`).

- float32: torch's AdamW (the fused kernel on CPU and CUDA), 8 bytes of state per weight.
- 8bit: bitsandbytes' block-wise 8-bit AdamW (Dettmers et al. 2022, "8-bit Optimizers via
  Block-wise Quantization"): each moment quantized in blocks of 256 values with a dynamic map and a
  float32 scale per block, about 2 bytes of state per weight, so a quarter of the memory. Tensors
  under 4096 values (norm scales, biases) keep float32 state, as the paper does. The paper matches
  32-bit AdamW's results at 125M-1.5B parameters; its cost is time on a CPU, where bitsandbytes'
  path is plain PyTorch that dequantizes, updates and quantizes each tensor (about 3 s a step for a
  135M-parameter model on 2 AVX2 cores, against 0.17 s for torch's fused AdamW), while on CUDA it is
  one fused kernel.

Written on bitsandbytes, the field's library for this, rather than by hand: the block-wise map is
what keeps the small updates of the second moment from rounding away, and that is its tested code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

STATES = ("float32", "8bit")
MIN_8BIT_SIZE = 4096  # smaller tensors keep float32 state (bitsandbytes' default, the paper's choice)


class OptimizerStateError(ValueError):
    """An optimizer state that this learner cannot take or make."""


def bitsandbytes_module() -> Any:
    """bitsandbytes, or an OptimizerStateError that says how to install it."""
    try:
        import bitsandbytes
    except ImportError as exc:
        raise OptimizerStateError("train.optimizer_state=8bit needs bitsandbytes: pip install 'reasonrl[memory]' "
                                  "(or pip install bitsandbytes)") from exc
    return bitsandbytes


def adamw(params: Sequence[torch.nn.Parameter], *, lr: float, betas: tuple[float, float], weight_decay: float,
          state: str, device: torch.device) -> torch.optim.Optimizer:
    """An AdamW over `params` whose moments are stored as `state` says (STATES)."""
    if state == "float32":
        # The fused kernel updates each tensor in one pass; the default per-tensor loop makes
        # several full-size temporaries per step (a third of a small model's update time on CPU).
        return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay,
                                 fused=device.type in ("cpu", "cuda"))
    if state == "8bit":
        bnb = bitsandbytes_module()
        return bnb.optim.AdamW8bit(params, lr=lr, betas=betas, weight_decay=weight_decay,
                                   min_8bit_size=MIN_8BIT_SIZE)
    raise OptimizerStateError(f"train.optimizer_state={state!r}: choose one of {', '.join(STATES)}")


def check_same_optimizer_state(saved: dict[str, Any], state: str) -> None:
    """Refuse a saved optimizer whose moments are stored otherwise than `state` (a checkpoint from
    before the setting existed is float32)."""
    saved_state = saved.get("optimizer_state", "float32")
    if saved_state != state:
        raise OptimizerStateError(f"this checkpoint's optimizer state is {saved_state} but train.optimizer_state="
                                  f"{state}: resume with train.optimizer_state={saved_state}")


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes the optimizer's per-weight state holds (moments, quantization maps and scales)."""
    return sum(value.numel() * value.element_size() for per_param in optimizer.state.values()
               for value in per_param.values() if isinstance(value, torch.Tensor))
