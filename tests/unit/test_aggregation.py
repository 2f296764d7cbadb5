"""Loss aggregations (reasonrl.algo.aggregation) against hand-computed values, and the invariance
they exist for: a micro-batch split of the batch changes neither the loss nor its gradient."""

from __future__ import annotations

import pytest
import torch
from helpers import F64, close, t

from reasonrl.algo.aggregation import (
    AGGREGATIONS,
    seq_mean_token_mean,
    seq_mean_token_sum,
    seq_mean_token_sum_norm,
    token_mean,
)


def test_token_mean_hand_value():
    # sum over masked tokens 1 + 2 + 4 = 7, divided by the batch's 3 tokens = 2.333333
    loss = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    assert token_mean(loss, mask, total_tokens=3, total_sequences=2).item() == pytest.approx(7 / 3)
    # the normaliser is the global count passed in, not this tensor's: 7 / 10
    assert token_mean(loss, mask, total_tokens=10, total_sequences=4).item() == pytest.approx(0.7)


def test_token_mean_empty_mask_is_zero_not_nan():
    out = token_mean(t([[1.0, 2.0]]), t([[0, 0]]), total_tokens=0, total_sequences=1)
    assert out.item() == 0.0


def test_token_mean_micro_batch_split_equals_whole_batch():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 12, generator=g, dtype=F64, requires_grad=True)
    lengths = torch.tensor([1, 12, 3, 7, 5, 12, 2, 9])
    mask = (torch.arange(12)[None, :] < lengths[:, None]).to(F64)
    total_tokens, total_sequences = float(mask.sum()), 8.0  # 51 tokens
    assert total_tokens == 1 + 12 + 3 + 7 + 5 + 12 + 2 + 9

    whole = token_mean(logits * 2.0, mask, total_tokens=total_tokens, total_sequences=total_sequences)
    (grad_whole,) = torch.autograd.grad(whole, logits)

    parts = [slice(0, 3), slice(3, 4), slice(4, 8)]  # uneven micro-batches
    split = sum(token_mean(logits[s] * 2.0, mask[s], total_tokens=total_tokens, total_sequences=total_sequences)
                for s in parts)
    (grad_split,) = torch.autograd.grad(split, logits)

    torch.testing.assert_close(split, whole)
    torch.testing.assert_close(grad_split, grad_whole)
    # each masked token's gradient is 2 / 51, padding gets 0
    torch.testing.assert_close(grad_whole, mask * 2.0 / 51)


def test_aggregations_by_hand():
    # masked losses: row 0 [1, 2, 3] (sum 6, mean 2), row 1 [4] (sum 4, mean 4); 4 tokens, 2 sequences.
    loss, mask = t([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]]), t([[1, 1, 1], [1, 0, 0]])
    totals = {"total_tokens": 4.0, "total_sequences": 2.0}
    assert token_mean(loss, mask, **totals).item() == pytest.approx(10 / 4)
    assert seq_mean_token_mean(loss, mask, **totals).item() == pytest.approx((2 + 4) / 2)
    assert seq_mean_token_sum(loss, mask, **totals).item() == pytest.approx((6 + 4) / 2)
    assert seq_mean_token_sum_norm(loss, mask, **totals, max_tokens=4).item() == pytest.approx(10 / (2 * 4))


@pytest.mark.parametrize("name", sorted(AGGREGATIONS))
def test_every_aggregation_is_unchanged_by_the_micro_batch_split(name):
    aggregate = AGGREGATIONS[name]
    extra = {"max_tokens": 12} if name == "seq_mean_token_sum_norm" else {}
    g = torch.Generator().manual_seed(5)
    per_token = torch.randn(8, 12, generator=g, dtype=F64, requires_grad=True)
    lengths = torch.tensor([1, 12, 3, 7, 5, 12, 2, 9])
    mask = (torch.arange(12)[None, :] < lengths[:, None]).to(F64)
    totals = {"total_tokens": float(mask.sum()), "total_sequences": 8.0, **extra}
    whole = aggregate(per_token, mask, **totals)
    (grad_whole,) = torch.autograd.grad(whole, per_token)
    split = sum(aggregate(per_token[s], mask[s], **totals) for s in (slice(0, 3), slice(3, 4), slice(4, 8)))
    (grad_split,) = torch.autograd.grad(split, per_token)
    close(split, whole, atol=1e-12)
    close(grad_split, grad_whole, atol=1e-12)


def test_the_registry_names_every_aggregation_and_each_name_gives_its_normaliser():
    assert set(AGGREGATIONS) == {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"}
    # Looked up by name, the example above (rows [1, 2, 3] and [4]; 4 tokens, 2 sequences): the token
    # mean 10 / 4, the mean of the sequence means (2 + 4) / 2, of the sequence sums (6 + 4) / 2, and
    # the sum over 2 sequences x 4 tokens, 10 / 8.
    loss, mask = t([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]]), t([[1, 1, 1], [1, 0, 0]])
    totals = {"total_tokens": 4.0, "total_sequences": 2.0}
    assert AGGREGATIONS["token_mean"](loss, mask, **totals).item() == pytest.approx(2.5)
    assert AGGREGATIONS["seq_mean_token_mean"](loss, mask, **totals).item() == pytest.approx(3.0)
    assert AGGREGATIONS["seq_mean_token_sum"](loss, mask, **totals).item() == pytest.approx(5.0)
    assert AGGREGATIONS["seq_mean_token_sum_norm"](loss, mask, **totals, max_tokens=4).item() == pytest.approx(1.25)
