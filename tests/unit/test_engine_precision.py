"""benchmarks/engine_precision: the gap per bucket of positions counts completion tokens only, each
in the bucket of its position in the whole sequence."""

from __future__ import annotations

import pytest
import torch
from benchmarks.engine_precision import gaps_by_position


def test_gaps_are_averaged_over_completion_tokens_per_bucket_of_positions():
    # Token i + 1 is scored at index i; a prompt of 3 tokens leaves its scores at indices 0-1 out.
    reference = torch.zeros(300)
    other = torch.cat([torch.full((2,), 9.0), torch.full((62,), 0.5), torch.full((236,), -0.25)])
    gaps = gaps_by_position({"float32": [reference], "engine": [other]}, starts=[3])
    assert gaps["engine"] == {"0-64": pytest.approx(0.5), "64-256": pytest.approx(0.25),
                              "256-512": pytest.approx(0.25)}
    assert gaps["float32"]["0-64"] == 0.0
