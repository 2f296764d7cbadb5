"""Loss aggregation: a per-token loss tensor in, the scalar to differentiate out.

The normaliser is a property of the *whole* batch (all micro-batches, all data-parallel ranks),
passed in as `total_tokens` / `total_sequences`, so that splitting the batch into micro-batches
and summing their losses gives exactly the loss of the whole batch (gradient accumulation
1 x 8 == 8 x 1).

`token_mean`: every completion token of the batch weighs the same (DAPO's token-level loss,
Yu et al. 2025, eq. 12): sum over tokens / number of tokens in the batch.
"""

from collections.abc import Callable

import torch


def token_mean(loss_NT: torch.Tensor, mask_NT: torch.Tensor, *, total_tokens: float, total_sequences: float) -> torch.Tensor:
    """sum(loss * mask) / total_tokens of the whole batch."""
    return (loss_NT * mask_NT).sum() / max(total_tokens, 1.0)


AGGREGATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "token_mean": token_mean,
}
