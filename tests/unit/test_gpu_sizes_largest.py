"""benchmarks/gpu_sizes.py's `largest` part: shapes in order with AdamW's state in float32 until one does
not fit, then from that shape on with the state in 8 bits, until one does not fit either."""

from __future__ import annotations

import argparse

import pytest
from benchmarks import gpu_sizes

FITS = {("1.5b", "float32"), ("3b", "float32"), ("7b", "8bit")}  # what a card of some size would hold


@pytest.fixture
def tried(monkeypatch, tmp_path):
    calls: list[tuple[int, str]] = []

    def fake_update(config, tokens, device, *, lora, mode, repeats, optimizer_state):
        size = {1536: "1.5b", 2048: "3b", 3584: "7b"}[config.hidden_size]
        calls.append((size, optimizer_state))
        assert (lora, mode) == (False, "full")
        return {} if (size, optimizer_state) in FITS else {"out_of_memory": True}

    monkeypatch.setattr(gpu_sizes, "update", fake_update)
    records = gpu_sizes.Records(tmp_path / "gpu_sizes.json", {"commit": "c", "source": "s"})
    return calls, records


def run(records, largest: str, bitsandbytes: bool, monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: (object() if bitsandbytes else None) if name == "bitsandbytes" else real(name, *a))
    args = argparse.Namespace(largest=largest, smoke=False)
    gpu_sizes.largest(args, records, gpu_sizes.SHAPES, gpu_sizes.VOCAB, device=None)


def test_the_8bit_sweep_starts_at_the_first_shape_that_did_not_fit(tried, monkeypatch):
    calls, records = tried
    run(records, "1.5b,3b,7b", bitsandbytes=True, monkeypatch=monkeypatch)
    assert calls == [("1.5b", "float32"), ("3b", "float32"), ("7b", "float32"), ("7b", "8bit")]
    assert sorted(records.report["records"]) == ["largest/1.5b", "largest/3b", "largest/7b", "largest_8bit/7b"]


def test_without_bitsandbytes_the_sweep_ends_at_the_first_that_does_not_fit(tried, monkeypatch):
    calls, records = tried
    run(records, "3b,7b", bitsandbytes=False, monkeypatch=monkeypatch)
    assert calls == [("3b", "float32"), ("7b", "float32")]


def test_a_rerun_measures_nothing_already_recorded(tried, monkeypatch):
    calls, records = tried
    run(records, "1.5b,3b,7b", bitsandbytes=True, monkeypatch=monkeypatch)
    calls.clear()
    run(records, "1.5b,3b,7b", bitsandbytes=True, monkeypatch=monkeypatch)
    assert calls == []
