"""The FusedDecoder against the transformers forward of the same weights: logits after a
left-padded prefill and several decode steps, for each supported architecture, grouped-query
attention, LoRA-merged weights, cache compaction, and bf16 weight packing."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from reasonrl.rollout import fused
from reasonrl.rollout.cuda_graph import StaticDecode
from reasonrl.rollout.fused import FusedDecoder, PackedLinear

SMALL = {"vocab_size": 61, "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 2,
         "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
         "initializer_range": 0.2}


def tiny(model_type: str, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{**SMALL, **overrides})
    return AutoModelForCausalLM.from_config(config).eval()


def reference_last_logits(model, sequences: list[list[int]]) -> torch.Tensor:
    """Logits after the last token of each sequence, each run alone (no padding at all)."""
    with torch.no_grad():
        return torch.stack([model(torch.tensor([s])).logits[0, -1] for s in sequences])


def fused_logits_per_step(decoder: FusedDecoder, prompts: list[list[int]], continuations: list[list[int]],
                          in_place: bool = False, chunked: bool = False, spare: bool = True) -> list[torch.Tensor]:
    """Logits after a left-padded prefill and after each continuation token; `in_place`: the decode
    steps are the static-shape ones a CUDA graph captures, in a cache with spare columns (`spare`, else
    one that must grow); `chunked`: the decode steps are told each row's first column (attention by
    runs of rows, fused.row_chunks)."""
    width = max(len(p) for p in prompts)
    tokens_NT = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    valid_NT = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts])
    positions_NT = (valid_NT.cumsum(1) - 1).clamp(min=0)
    capacity = width + len(continuations[0]) + 3 if in_place and spare else width + 1  # else too small: must grow
    cache = decoder.new_cache(rows=len(prompts), capacity=capacity)
    outputs = [decoder.forward(tokens_NT, positions_NT, valid_NT, cache)]
    static = StaticDecode(decoder, cache)
    position_N = positions_NT[:, -1] + 1
    for step in range(len(continuations[0])):
        next_N1 = torch.tensor([[c[step]] for c in continuations])
        if in_place:
            outputs.append(static.step(next_N1[:, 0], position_N))
        else:
            starts = [width - len(p) for p in prompts] if chunked else None
            outputs.append(decoder.forward(next_N1, position_N[:, None], torch.ones_like(next_N1, dtype=torch.bool),
                                           cache, row_starts=starts))
        position_N = position_N + 1
    return outputs


ARCHITECTURES = {
    "llama": {},
    "llama_mha_tied": {"num_key_value_heads": 6, "tie_word_embeddings": True},
    "qwen2": {},  # q/k/v biases
    "qwen3": {},  # q/k RMS norms over each head
    "mistral_window": {"sliding_window": 3},  # shorter than the sequences: the window matters
    "llama_rope_scaling": {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
}


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_logits_equal_the_transformers_forward(name):
    model_type = name.split("_")[0]
    model = tiny(model_type, **ARCHITECTURES[name])
    if model_type == "qwen2":
        assert model.model.layers[0].self_attn.q_proj.bias is not None
    decoder = FusedDecoder(model)
    prompts = [[5, 9, 11, 3], [7, 2], [4, 4, 8, 1, 30, 2]]
    continuations = [[12, 13, 14], [40, 41, 42], [50, 51, 52]]
    for step, logits_NV in enumerate(fused_logits_per_step(decoder, prompts, continuations)):
        expected = reference_last_logits(model, [p + c[:step] for p, c in zip(prompts, continuations)])
        torch.testing.assert_close(logits_NV, expected, atol=1e-4, rtol=1e-4)
        assert not logits_NV.requires_grad  # called without no_grad, autograd still records nothing


@pytest.mark.parametrize("name", [name for name in ARCHITECTURES if "window" not in name])
def test_the_static_shape_decode_step_equals_the_transformers_forward(name):
    # What a CUDA graph replays: the column written is a tensor, attention reads the whole capacity
    # (spare columns masked), the prompts' left padding stays masked.
    model = tiny(name.split("_")[0], **ARCHITECTURES[name])
    prompts = [[5, 9, 11, 3], [7, 2], [4, 4, 8, 1, 30, 2]]
    continuations = [[12, 13, 14], [40, 41, 42], [50, 51, 52]]
    in_place = fused_logits_per_step(FusedDecoder(model), prompts, continuations, in_place=True)
    eager = fused_logits_per_step(FusedDecoder(model), prompts, continuations)
    for step, logits_NV in enumerate(in_place):
        expected = reference_last_logits(model, [p + c[:step] for p, c in zip(prompts, continuations)])
        torch.testing.assert_close(logits_NV, expected, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(logits_NV, eager[step], atol=1e-5, rtol=1e-5)
    # A GPU's cache is in the weights' dtype: the float32 keys and values are cast on the way in.
    bf16_cache = FusedDecoder(model)
    bf16_cache.cache_dtype = torch.bfloat16
    for in_place_NV, eager_NV in zip(fused_logits_per_step(bf16_cache, prompts, continuations, in_place=True),
                                     fused_logits_per_step(bf16_cache, prompts, continuations)):
        torch.testing.assert_close(in_place_NV, eager_NV, atol=1e-5, rtol=1e-5)


def test_a_static_step_grows_a_full_cache_before_writing_its_column():
    model = tiny("llama")
    prompts, continuations = [[5, 9, 11, 3], [7, 2]], [[12, 13, 14], [40, 41, 42]]
    grown = fused_logits_per_step(FusedDecoder(model), prompts, continuations, in_place=True, spare=False)
    eager = fused_logits_per_step(FusedDecoder(model), prompts, continuations)
    assert len(grown) == len(eager) == 4
    for grown_NV, eager_NV in zip(grown, eager):
        torch.testing.assert_close(grown_NV, eager_NV, atol=1e-5, rtol=1e-5)


def test_row_chunks_by_hand(monkeypatch):
    monkeypatch.setattr(fused, "ATTENTION_CHUNK_ROWS", 2)
    # Rows starting at 0, 1, 8, 9 in a cache read up to column 10: runs [0, 2) from 0 and [2, 4) from 8
    # read 2 x 10 + 2 x 2 = 24 columns, against 4 x 10 = 40 in one run: 0.6 <= 0.8, so runs.
    assert fused.row_chunks([0, 1, 8, 9], first_new=9, end=10) == ((0, 2, 0), (2, 4, 8))
    # Interleaved, each run starts early: 2 x 10 + 2 x 9 = 38 of 40 columns, so one run from 0.
    assert fused.row_chunks([0, 8, 1, 9], first_new=9, end=10) == ((0, 4, 0),)
    # One run still skips the columns no row reads; starts past this step's first column are clamped to it.
    assert fused.row_chunks([3, 4, 5], first_new=9, end=10) == ((0, 3, 3),)
    assert fused.row_chunks([12, 20], first_new=9, end=10) == ((0, 2, 9),)


@pytest.mark.parametrize("name", ["llama", "qwen3", "mistral_window"])
def test_attention_by_runs_of_rows_equals_the_transformers_forward(name, monkeypatch):
    # Two long prompts then eight short ones, as a continuous batch lays them (longest first): the
    # decode steps read the short rows' runs from their own first column.
    monkeypatch.setattr(fused, "ATTENTION_CHUNK_ROWS", 2)
    model = tiny(name.split("_")[0], **ARCHITECTURES[name])
    prompts = [list(range(3, 23)), list(range(5, 24))] + [[7 + row, 2] for row in range(8)]
    continuations = [[12 + row, 13, 14] for row in range(10)]
    width = max(map(len, prompts))
    assert len(fused.row_chunks([width - len(p) for p in prompts], width, width + 1)) == 5
    for step, logits_NV in enumerate(fused_logits_per_step(FusedDecoder(model), prompts, continuations, chunked=True)):
        expected = reference_last_logits(model, [p + c[:step] for p, c in zip(prompts, continuations)])
        torch.testing.assert_close(logits_NV, expected, atol=1e-4, rtol=1e-4)


def test_the_static_shape_decode_step_refuses_a_sliding_window():
    decoder = FusedDecoder(tiny("mistral", sliding_window=3))
    with pytest.raises(ValueError, match="sliding window"):
        decoder.decode_in_place(torch.tensor([[1]]), torch.tensor([[0]]), torch.tensor([0]), decoder.new_cache(1, 4))


def test_unsupported_architectures_are_refused():
    model = tiny("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=1)
    assert not FusedDecoder.supports(model)
    with pytest.raises(ValueError, match="sliding"):
        FusedDecoder(model)


def test_lora_adapters_are_merged_into_the_decoder_and_the_base_stays_exact():
    from peft import LoraConfig, get_peft_model

    model = tiny("llama")
    base_weight = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)  # a fresh adapter is a no-op; make it matter
    lora.eval()
    prompts, continuations = [[5, 9, 11, 3], [7, 2]], [[12, 13], [40, 41]]
    fused = fused_logits_per_step(FusedDecoder(lora), prompts, continuations)
    for step, logits_NV in enumerate(fused):
        expected = reference_last_logits(lora, [p + c[:step] for p, c in zip(prompts, continuations)])
        torch.testing.assert_close(logits_NV, expected, atol=1e-4, rtol=1e-4)
    with lora.disable_adapter():
        without_adapter = reference_last_logits(lora, [prompts[0]])
    assert not torch.allclose(fused[0][:1], without_adapter, atol=1e-2)
    assert torch.equal(model.model.layers[0].self_attn.q_proj.base_layer.weight, base_weight)


def test_selecting_rows_keeps_their_cache():
    model = tiny("llama")
    decoder = FusedDecoder(model)
    prompts = [[5, 9, 11, 3], [7, 2], [4, 4, 8]]
    width = 4
    tokens_NT = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    valid_NT = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts])
    cache = decoder.new_cache(rows=3, capacity=8)
    decoder.forward(tokens_NT, (valid_NT.cumsum(1) - 1).clamp(min=0), valid_NT, cache)
    cache.select_rows(torch.tensor([2, 0, 2]), capacity=6)
    assert cache.capacity == 6 and cache.keys_LNKSD.shape[1] == 3
    next_N1 = torch.tensor([[20], [21], [22]])
    positions_N1 = torch.tensor([[3], [4], [3]])
    logits = decoder.forward(next_N1, positions_N1, torch.ones(3, 1, dtype=torch.bool), cache)
    expected = reference_last_logits(model, [prompts[2] + [20], prompts[0] + [21], prompts[2] + [22]])
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def test_packed_bf16_linear_equals_the_plain_one():
    torch.manual_seed(0)
    weight, bias = torch.randn(40, 24).bfloat16(), torch.randn(40).bfloat16()
    packed = PackedLinear(weight, bias)
    for rows in (1, 3, 17):
        x = torch.randn(rows, 2, 24).bfloat16()
        torch.testing.assert_close(packed(x), torch.nn.functional.linear(x, weight, bias), atol=1e-2, rtol=1e-2)


def test_bf16_decoding_keeps_the_residual_stream_in_float32():
    # The engine decodes with bfloat16 weights; the learner scores the samples with float32 weights
    # under bfloat16 autocast, which keeps the residual stream in float32. With the same weights
    # (rounded to bfloat16), the engine's log-probs must be clearly closer to the float32 forward
    # than those of the plain bfloat16 forward, whose residual stream is rounded at every layer.
    # Measured: 0.67 of the plain forward's distance (0.89 with a bfloat16 residual stream).
    shape = {"num_hidden_layers": 6, "hidden_size": 96, "intermediate_size": 160, "num_attention_heads": 12,
             "num_key_value_heads": 4, "vocab_size": 200}
    distances = {"fused": 0.0, "plain_bf16": 0.0}
    for seed in range(3):
        learner = tiny("llama", **shape)
        with torch.no_grad():
            for param in learner.parameters():
                param.copy_(param.bfloat16().float())
        engine_model = tiny("llama", **shape).bfloat16()
        engine_model.load_state_dict(learner.state_dict())
        generator = torch.Generator().manual_seed(seed)
        prompts = [torch.randint(0, 200, (n,), generator=generator).tolist() for n in (6, 2, 9)]
        continuations = [torch.randint(0, 200, (5,), generator=generator).tolist() for _ in prompts]
        sequences = [p + c for p, c in zip(prompts, continuations)]
        reference = torch.log_softmax(reference_last_logits(learner, sequences), -1)
        with torch.no_grad():
            fused = fused_logits_per_step(FusedDecoder(engine_model), prompts, continuations)[-1]
        logits = {"fused": fused, "plain_bf16": reference_last_logits(engine_model, sequences)}
        for name, value in logits.items():
            distances[name] += float((torch.log_softmax(value.float(), -1) - reference).abs().mean())
    assert distances["fused"] < 0.8 * distances["plain_bf16"], distances
