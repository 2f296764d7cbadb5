"""benchmarks/decode_profile.py: its `sdpa` variant computes the decode step the engine computes, and
its comparison would catch one that does not."""

from __future__ import annotations

import types

import torch
from benchmarks import decode_profile
from benchmarks.gpu_sizes import qwen_config, random_model

SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "tie_word_embeddings": True}
CPU = torch.device("cpu")


def prefilled() -> decode_profile.Prefilled:
    model = random_model(qwen_config(SHAPE, vocab=100), torch.float32, CPU).eval()
    return decode_profile.Prefilled(model, rows=4, prompt_tokens=5, new_tokens=3, device=CPU)


def test_the_sdpa_variant_gives_the_step_s_logits():
    start = prefilled()
    decoder, cache = start.fresh()
    decode_profile.with_sdpa_attention(decoder)
    got = decode_profile.eager_step(decoder, cache, start)
    expected = decode_profile.eager_step(*start.fresh(), start)
    assert torch.allclose(got, expected, atol=1e-5)
    assert decode_profile.variant_record(start, decode_profile.with_sdpa_attention, None, steps=1)[
        "max_logit_diff"] < 1e-5


def test_a_variant_that_attends_to_nothing_is_told_apart():
    def no_attention(decoder):
        decoder._attend = types.MethodType(lambda self, q, k, v, mask: torch.zeros_like(q), decoder)

    assert decode_profile.variant_record(prefilled(), no_attention, None, steps=1)["max_logit_diff"] > 1e-2


def test_a_failing_variant_is_recorded_not_raised():
    def broken(decoder):
        raise RuntimeError("no kernel for this shape")

    assert decode_profile.variant_record(prefilled(), broken, None, steps=1) == {
        "error": "RuntimeError: no kernel for this shape"}


def test_the_cpu_profile_lists_operators_and_leaves_the_graph_out():
    record = decode_profile.profile_decode_step(prefilled().model, rows=4, prompt_tokens=5, new_tokens=3,
                                                device=CPU, steps=2)
    assert record["graph_ms"] is None and record["capacity"] == 8 and record["sampling_ms"] > 0
    assert any(op["name"].endswith("mm") and op["calls"] > 0 for op in record["operators"])  # a matrix product
    assert set(record["variants"]) == {"sdpa"}
