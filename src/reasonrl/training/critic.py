"""The critic of PPO with GAE: a value model trained alongside the policy.

The value model is a separate copy of a base model with a scalar head on every position
(`models.load_value_model`: transformers' AutoModelForTokenClassification with one label). Its
value at position t estimates the return from the state that predicts completion token t + 1, the
same positions the learner's log-probs use. It regresses the lambda-returns with the clipped
value loss of `reasonrl.algo.value`, with its own optimizer settings (`critic.*` in the config),
and is updated with the same epochs, mini-batches and micro-batches as the policy (packed into
rows without padding where the policy's are, `train.pack_sequences`).
"""

from __future__ import annotations

from typing import Any

import torch

from reasonrl.algo.aggregation import token_mean
from reasonrl.algo.value import clipped_value_loss
from reasonrl.models import value_head
from reasonrl.training.learner import Learner, OptimConfig, backward_finite
from reasonrl.training.packing import VARLEN, PackedRow
from reasonrl.training.token_stats import scatter_to_mask
from reasonrl.types import TrainBatch


def token_values(model: Any, batch: TrainBatch) -> torch.Tensor:
    """The value model's output at the loss positions of the batch (zero elsewhere), (N, T-1);
    from one packed row when the learner packs (`attention_for` set VARLEN), as the policy's
    log-probs are."""
    attention, where_NT = batch.attention_mask_NT, batch.loss_mask_NT.bool()
    if model.config._attn_implementation == VARLEN:
        row = PackedRow.of(attention, batch.input_ids_NT)
        hidden_1LH = model.base_model(input_ids=row.pack(batch.input_ids_NT), position_ids=row.positions_1L,
                                      use_cache=False, packed_row=row).last_hidden_state
        hidden_KH = hidden_1LH[0, row.index_of(where_NT)]
    else:
        hidden_NTH = model.base_model(input_ids=batch.input_ids_NT, attention_mask=attention,
                                      position_ids=(attention.cumsum(1) - 1).clamp(min=0)).last_hidden_state
        hidden_KH = hidden_NTH[:, :-1][where_NT]
    return scatter_to_mask(where_NT, value_head(model)(hidden_KH).squeeze(-1).float())


class Critic:
    """A value model with its optimizer: values for GAE, and an update towards the returns."""

    def __init__(self, model: Any, optim: OptimConfig, *, value_clip: float,
                 autocast_dtype: torch.dtype | None = None, seed: int = 0, pack: bool = False,
                 micro_batch_positions: int = 0):
        self.learner = Learner(model, optim, autocast_dtype=autocast_dtype, seed=seed, pack=pack,
                               micro_batch_positions=micro_batch_positions)
        self.value_clip = value_clip

    @property
    def model(self) -> Any:
        return self.learner.model

    def values(self, batch: TrainBatch, micro_batch_size: int) -> torch.Tensor:
        """No-grad values of the whole batch, (N, T-1), zero off the loss mask."""
        self.model.eval()
        return self.learner.per_token(self.model, batch, micro_batch_size, token_values)

    def update(self, batch: TrainBatch, *, epochs: int = 1, mini_batches: int = 1, micro_batch_size: int = 8,
               step: int = 0) -> dict[str, float]:
        """Fit the values to `batch.returns_NT`, clipped around `batch.old_values_NT`."""
        if batch.returns_NT is None or batch.old_values_NT is None:
            raise ValueError("the critic's update needs the batch's returns and values before the update")
        self.model.train()

        def backward(micro: TrainBatch, total_tokens: float, total_sequences: int, generator: torch.Generator):
            with self.learner.autocast():
                values_NT = token_values(self.model, micro)
            loss_NT, metrics = clipped_value_loss(values_NT, micro.old_values_NT, micro.returns_NT, micro.loss_mask_NT,
                                                  value_clip=self.value_clip)
            scalar = token_mean(loss_NT, micro.loss_mask_NT, total_tokens=total_tokens, total_sequences=total_sequences)
            return backward_finite(scalar), {f"critic/{key}": value for key, value in metrics.items()}

        return self.learner.optimize(batch, backward, epochs=epochs, mini_batches=mini_batches,
                                     micro_batch_size=micro_batch_size, step=step, loss_key="critic/value_loss",
                                     prefix="critic")

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "learner": self.learner.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.learner.load_state_dict(state["learner"])
