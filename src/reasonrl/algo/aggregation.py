"""Loss aggregation: a per-token loss tensor in, the scalar to differentiate out.

The normaliser is a property of the *whole* batch (all micro-batches, all data-parallel ranks),
passed in as `total_tokens` / `total_sequences`, so that splitting the batch into micro-batches
and summing their losses gives exactly the loss of the whole batch (gradient accumulation
1 x 8 == 8 x 1). A sequence is never split across micro-batches, so per-sequence sums are whole.

- `token_mean`: every completion token of the batch weighs the same (Yu et al. 2025, "DAPO",
  eq. 12): sum_i sum_t l_it / sum_i |y_i|.
- `seq_mean_token_mean`: every sequence weighs the same, its tokens averaged (the original GRPO,
  Shao et al. 2024, eq. 3): 1/N sum_i (1/|y_i|) sum_t l_it.
- `seq_mean_token_sum`: 1/N sum_i sum_t l_it (long sequences weigh more).
- `seq_mean_token_sum_norm`: Liu et al. 2025, "Understanding R1-Zero-Like Training" (Dr. GRPO):
  a constant normaliser, 1/(N * max_tokens) sum_i sum_t l_it, with max_tokens the generation
  budget, so that no length bias enters through the normaliser.
"""

from collections.abc import Callable

import torch

from reasonrl.spec import declare


@declare()
def token_mean(loss_NT: torch.Tensor, mask_NT: torch.Tensor, *, total_tokens: float, total_sequences: float) -> torch.Tensor:
    """sum(loss * mask) / total_tokens of the whole batch."""
    return (loss_NT * mask_NT).sum() / max(total_tokens, 1.0)


@declare()
def seq_mean_token_mean(loss_NT: torch.Tensor, mask_NT: torch.Tensor, *, total_tokens: float,
                        total_sequences: float) -> torch.Tensor:
    """Mean over the batch's sequences of each sequence's token mean."""
    per_sequence_N = (loss_NT * mask_NT).sum(dim=1) / mask_NT.sum(dim=1).clamp(min=1)
    return per_sequence_N.sum() / max(total_sequences, 1.0)


@declare()
def seq_mean_token_sum(loss_NT: torch.Tensor, mask_NT: torch.Tensor, *, total_tokens: float,
                       total_sequences: float) -> torch.Tensor:
    """Mean over the batch's sequences of each sequence's token sum."""
    return (loss_NT * mask_NT).sum() / max(total_sequences, 1.0)


@declare(inputs=("max_tokens",))
def seq_mean_token_sum_norm(loss_NT: torch.Tensor, mask_NT: torch.Tensor, *, total_tokens: float,
                            total_sequences: float, max_tokens: int) -> torch.Tensor:
    """Token sum over the batch / (sequences * max_tokens), a constant per batch size."""
    return (loss_NT * mask_NT).sum() / (max(total_sequences, 1.0) * max_tokens)


AGGREGATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "token_mean": token_mean,
    "seq_mean_token_mean": seq_mean_token_mean,
    "seq_mean_token_sum": seq_mean_token_sum,
    "seq_mean_token_sum_norm": seq_mean_token_sum_norm,
}
