"""Padding-free packing (reasonrl.training.packing): the row layout by hand, shared prefixes (a
group's prompt, the branches of a tree of completions) held once, and packed log-probs and
gradients (of a policy, and of a critic's value model) equal to the padded computation for each
supported decoder family."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForTokenClassification,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from reasonrl.algo.aggregation import token_mean
from reasonrl.algo.objectives import ppo_clip
from reasonrl.training import packing
from reasonrl.training.critic import Critic, token_values
from reasonrl.training.learner import (
    Learner,
    OptimConfig,
    PolicyLoss,
    make_train_batch,
    token_logprobs,
)
from reasonrl.training.packing import (
    VARLEN,
    PackedRow,
    attention_for,
    micro_batches,
    packable,
    varlen_attention,
)
from reasonrl.types import Completion, Group, Problem


def test_packed_row_layout_by_hand():
    # Two right-padded sequences and a left-padded one: 3 + 2 + 3 real tokens.
    row = PackedRow.of(torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 1, 1, 1]]))
    ids_NT = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [0, 10, 11, 12]])
    assert row.pack(ids_NT).tolist() == [[5, 6, 7, 8, 9, 10, 11, 12]]
    assert row.positions_1L.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    assert row.bounds.tolist() == [0, 3, 5, 8]
    # Loss positions (n, t) in an [N, T-1] mask: (0, 1), (1, 0), (2, 1), (2, 2). The third row's
    # real tokens sit in columns 1-3 and in row slots 5-7, so its columns 1 and 2 are slots 5 and 6.
    where_NT = torch.tensor([[0, 1, 0], [1, 0, 0], [0, 1, 1]], dtype=torch.bool)
    assert row.index_of(where_NT).tolist() == [1, 3, 5, 6]


def test_shared_prefixes_are_packed_once_by_hand():
    # All three sequences start with 5 (sequence 1 is left-padded); sequences 0 and 2 go on with 6.
    # Loss mask [N, T-1]: position t predicts token t + 1.
    attention_NT = torch.tensor([[1, 1, 1, 1, 0], [0, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    ids_NT = torch.tensor([[5, 6, 7, 8, 0], [0, 5, 9, 10, 11], [5, 6, 12, 0, 0]])
    loss_NT = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1], [0, 1, 0, 0]])
    row = PackedRow.of(attention_NT, ids_NT)
    # Segments, each parent before its children: [5] (all three), [6] (0 and 2), sequence 0's rest
    # [7, 8], sequence 2's rest [12], sequence 1's rest [9, 10, 11].
    assert row.pack(ids_NT).tolist() == [[5, 6, 7, 8, 12, 9, 10, 11]]
    assert row.positions_1L.tolist() == [[0, 1, 2, 3, 2, 1, 2, 3]]
    assert row.bounds.tolist() == [0, 1, 2, 4, 5, 8]
    assert row.ancestors_of == ((), (0,), (0, 1), (0, 1), (0,))
    # Loss positions: (0, 1) and (0, 2) predict 7 and 8 from slots 1 and 2; (1, 2), (1, 3) are
    # sequence 1's tokens 9 and 10 (slots 5, 6); (2, 1) predicts 12 from the shared slot 1.
    assert row.index_of(loss_NT.bool()).tolist() == [1, 2, 5, 6, 1]
    # Without the token ids nothing is shared.
    assert PackedRow.of(attention_NT).pack(ids_NT).tolist() == [[5, 6, 7, 8, 5, 9, 10, 11, 5, 6, 12]]


def test_a_continuation_attends_to_its_prompt_and_causally_to_itself():
    torch.manual_seed(0)
    query_BHLD, key_BKLD, value_BKLD = torch.randn(1, 4, 9, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    # Row: prompt (3 positions), continuation a (2), continuation b (4).
    row = PackedRow(slot_NT=torch.zeros(0), source_L=torch.zeros(0), positions_1L=torch.zeros(0),
                    bounds=torch.tensor([0, 3, 5, 9]), ancestors_of=((), (0,), (0,)))
    out_BLHD, _ = varlen_attention(torch.nn.Module(), query_BHLD, key_BKLD, value_BKLD, None, scaling=0.3,
                                   packed_row=row)
    for rest in (slice(3, 5), slice(5, 9)):
        whole = torch.cat([torch.arange(0, 3), torch.arange(rest.start, rest.stop)])
        expected_BHnD = F.scaled_dot_product_attention(query_BHLD[:, :, whole], key_BKLD[:, :, whole],
                                                       value_BKLD[:, :, whole], is_causal=True, scale=0.3,
                                                       enable_gqa=True)
        torch.testing.assert_close(out_BLHD[:, :3], expected_BHnD.transpose(1, 2)[:, :3])
        torch.testing.assert_close(out_BLHD[:, rest], expected_BHnD.transpose(1, 2)[:, 3:])


@pytest.mark.parametrize("max_scores, overhead, long_scores, buckets, long_segments",
                         [(1, 1, 1 << 19, 9, 0), (1 << 19, 1 << 19, 1 << 19, 1, 0), (1 << 19, 30, 1 << 19, 6, 0),
                          (1 << 19, 30, 30, 2, 5)])
def test_bucketed_attention_and_its_gradients_equal_per_segment_attention(monkeypatch, max_scores, overhead,
                                                                          long_scores, buckets, long_segments):
    # Segments of lengths 1..9 in two trees (chains of up to three ancestors), plus a lone sequence
    # and an empty segment: one bucket per segment, all in one padded bucket, a few buckets in
    # between, and the 5 segments with more than 30 scores (size x (ancestors' sizes + size): 5 x 5,
    # 1 x 6, 9 x 15, 4 x 9, 3 x 3, 7 x 10, 2 x 12, 6 x 6, 8 x 20) attended to alone, 4 after
    # ancestors and one without.
    monkeypatch.setattr(packing, "BUCKET_MAX_SCORES", max_scores)
    monkeypatch.setattr(packing, "BUCKET_OVERHEAD_SCORES", overhead)
    monkeypatch.setattr(packing, "LONG_SEGMENT_SCORES", long_scores)
    sizes = [5, 1, 9, 4, 3, 7, 2, 6, 0, 8]
    ancestors_of = ((), (0,), (0, 1), (0,), (), (4,), (4, 5), (), (0,), (4, 5, 6))
    bounds = F.pad(torch.tensor(sizes).cumsum(0), (1, 0))
    row = PackedRow(slot_NT=torch.zeros(0), source_L=torch.zeros(0), positions_1L=torch.zeros(0),
                    bounds=bounds, ancestors_of=ancestors_of)
    plan = row.attention_plan(6, 2)
    assert (len(plan.buckets), len(plan.long_segments)) == (buckets, long_segments)
    L = int(bounds[-1])
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn(1, heads, L, 8, generator=generator, dtype=torch.float64, requires_grad=True)
              for heads in (6, 2, 2)]
    upstream_BLHD = torch.randn(1, L, 6, 8, generator=generator, dtype=torch.float64)
    out_BLHD, _ = varlen_attention(torch.nn.Module(), *inputs, None, scaling=0.3, packed_row=row)
    gradients = torch.autograd.grad((out_BLHD * upstream_BLHD).sum(), inputs)

    expected_BLHD = torch.zeros_like(out_BLHD)
    starts = bounds.tolist()
    for s, ancestors in enumerate(ancestors_of):
        own = torch.arange(starts[s], starts[s + 1])
        keys = torch.cat([*(torch.arange(starts[a], starts[a + 1]) for a in ancestors), own])
        query_BHnD, key_BKmD, value_BKmD = inputs[0][:, :, own], inputs[1][:, :, keys], inputs[2][:, :, keys]
        mask_nm = torch.ones(len(own), len(keys), dtype=torch.bool).tril(len(keys) - len(own))
        attended = F.scaled_dot_product_attention(query_BHnD, key_BKmD, value_BKmD, attn_mask=mask_nm, scale=0.3,
                                                  enable_gqa=True)
        expected_BLHD = expected_BLHD.index_add(1, own, attended.transpose(1, 2))
    expected_gradients = torch.autograd.grad((expected_BLHD * upstream_BLHD).sum(), inputs)
    torch.testing.assert_close(out_BLHD, expected_BLHD)
    for gradient, expected in zip(gradients, expected_gradients):
        torch.testing.assert_close(gradient, expected)


def test_varlen_attention_is_causal_attention_within_each_sequence():
    torch.manual_seed(0)
    query_BHLD, key_BKLD, value_BKLD = torch.randn(1, 4, 7, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    module = torch.nn.Module()
    out_BLHD, _ = varlen_attention(module, query_BHLD, key_BKLD, value_BKLD, None, scaling=0.3,
                                   cu_seq_lens_q=torch.tensor([0, 3, 7]))
    for start, end in ((0, 3), (3, 7)):
        expected_BHnD = F.scaled_dot_product_attention(query_BHLD[:, :, start:end], key_BKLD[:, :, start:end],
                                                       value_BKLD[:, :, start:end], is_causal=True, scale=0.3,
                                                       enable_gqa=True)
        torch.testing.assert_close(out_BLHD[:, start:end], expected_BHnD.transpose(1, 2))
    with pytest.raises(ValueError, match="layout"):
        varlen_attention(module, query_BHLD, key_BKLD, value_BKLD, None)
    with pytest.raises(ValueError, match="batch 1, got 2"):
        varlen_attention(module, query_BHLD.expand(2, -1, -1, -1), key_BKLD.expand(2, -1, -1, -1),
                         value_BKLD.expand(2, -1, -1, -1), None, cu_seq_lens_q=torch.tensor([0, 3, 7]))
    with pytest.raises(ValueError, match="4 over 3"):
        varlen_attention(module, query_BHLD, torch.randn(1, 3, 7, 8), torch.randn(1, 3, 7, 8), None,
                         cu_seq_lens_q=torch.tensor([0, 3, 7]))



def test_varlen_attention_computes_in_the_value_dtype_and_skips_empty_sequences():
    # Under autocast the rotated query and key arrive in float32 and the value in bfloat16.
    torch.manual_seed(0)
    query_BHLD, key_BKLD = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 6, 8)
    value_BKLD = torch.randn(1, 2, 6, 8).bfloat16()
    out_BLHD, _ = varlen_attention(torch.nn.Module(), query_BHLD, key_BKLD, value_BKLD, None, scaling=0.3,
                                   cu_seq_lens_q=torch.tensor([0, 2, 2, 6]))
    assert out_BLHD.dtype == torch.bfloat16 and out_BLHD.shape == (1, 6, 4, 8)
    for start, end in ((0, 2), (2, 6)):
        expected_BHnD = F.scaled_dot_product_attention(
            query_BHLD[:, :, start:end].bfloat16().float(), key_BKLD[:, :, start:end].bfloat16().float(),
            value_BKLD[:, :, start:end].float(), is_causal=True, scale=0.3, enable_gqa=True)
        torch.testing.assert_close(out_BLHD[:, start:end].float(), expected_BHnD.transpose(1, 2), atol=2e-2, rtol=2e-2)


FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),  # q/k/v biases
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),  # q/k norms
}


def tiny(family: str):
    config_class, model_class = FAMILIES[family]
    torch.manual_seed(0)
    model = model_class(config_class(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                     max_position_embeddings=64))
    model.set_attn_implementation("sdpa")
    return model


def batch_of_uneven_lengths():
    generator = torch.Generator().manual_seed(1)
    groups = [Group(problem=Problem(id="p", prompt="x", answer="1"),
                    prompt_ids=tuple(torch.randint(1, 32, (3 + b,), generator=generator).tolist()),
                    completions=tuple(Completion(token_ids=tuple(torch.randint(1, 32, (n,), generator=generator).tolist()),
                                                 text="", logprobs=(-1.0,) * n, finish_reason="stop")
                                      for n in (1, 6, 3, 9)))
              for b in range(2)]
    return make_train_batch(groups, torch.randn(8, generator=generator).tolist(), pad_id=0)


@pytest.mark.parametrize("long_scores", [packing.LONG_SEGMENT_SCORES, 20])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_packed_log_probs_equal_the_padded_ones(monkeypatch, family, long_scores):
    # With 20, the completions of 6 and 9 tokens (6 x 9 and 9 x 12 scores) are attended to alone.
    monkeypatch.setattr(packing, "LONG_SEGMENT_SCORES", long_scores)
    model, batch = tiny(family), batch_of_uneven_lengths()
    assert packable(model)
    with torch.no_grad():
        padded_NT, _ = token_logprobs(model, batch, temperature=0.7)
        with attention_for(model, batch.input_ids_NT.shape, pack=True):
            assert model.config._attn_implementation == VARLEN
            packed_NT, _ = token_logprobs(model, batch, temperature=0.7)
    assert model.config._attn_implementation == "sdpa"
    mask_NT = batch.loss_mask_NT.bool()
    # Each group's prompt is in the row once: 2 prompts (3 and 4 tokens) and 8 completions.
    row = PackedRow.of(batch.attention_mask_NT, batch.input_ids_NT)
    assert row.source_L.numel() == 3 + 4 + 2 * (1 + 6 + 3 + 9)
    assert (padded_NT[mask_NT] < -0.5).all()  # real log-probs, not zeros
    torch.testing.assert_close(packed_NT, padded_NT, atol=1e-5, rtol=1e-5)


def gradients(pack: bool, micro_batch_size: int, micro_batch_positions: int = 0) -> dict[str, torch.Tensor]:
    model = tiny("llama")
    learner = Learner(model, OptimConfig(lr=0.0, grad_clip=0.0), pack=pack, micro_batch_positions=micro_batch_positions)
    learner.update(batch_of_uneven_lengths(), PolicyLoss(objective=ppo_clip, aggregation=token_mean, entropy_coef=0.01),
                   micro_batch_size=micro_batch_size)
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def test_packed_gradients_equal_the_padded_ones_for_any_micro_batch_split(monkeypatch):
    padded = gradients(pack=False, micro_batch_size=8)
    assert any(g.abs().sum() > 0 for g in padded.values())
    for micro_batch_size, positions, long_scores in ((8, 0, packing.LONG_SEGMENT_SCORES), (3, 0, 20), (8, 12, 20)):
        monkeypatch.setattr(packing, "LONG_SEGMENT_SCORES", long_scores)
        packed = gradients(pack=True, micro_batch_size=micro_batch_size, micro_batch_positions=positions)
        for name in padded:
            torch.testing.assert_close(packed[name], padded[name], atol=1e-6, rtol=1e-5, msg=name)


def tiny_value_model() -> LlamaForTokenClassification:
    torch.manual_seed(0)
    model = LlamaForTokenClassification(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                                    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                                    head_dim=8, max_position_embeddings=64, num_labels=1))
    model.set_attn_implementation("sdpa")
    return model


def test_packed_critic_values_and_gradients_equal_the_padded_ones():
    batch = batch_of_uneven_lengths()
    returns_NT = torch.randn(batch.loss_mask_NT.shape, generator=torch.Generator().manual_seed(2))
    batch = replace(batch, returns_NT=returns_NT * batch.loss_mask_NT,
                    old_values_NT=torch.zeros_like(returns_NT))
    results = {}
    for pack, micro_batch_size in ((False, 8), (True, 8), (True, 3)):
        model = tiny_value_model()
        critic = Critic(model, OptimConfig(lr=0.0, grad_clip=0.0), value_clip=0.2, pack=pack)
        values_NT = critic.values(batch, micro_batch_size)
        metrics = critic.update(batch, micro_batch_size=micro_batch_size)
        results[pack, micro_batch_size] = values_NT, metrics, {n: p.grad.clone() for n, p in model.named_parameters()}
    padded_values, padded_metrics, padded_grads = results[False, 8]
    mask_NT = batch.loss_mask_NT.bool()
    assert padded_values[mask_NT].abs().min() > 0 and (padded_values[~mask_NT] == 0).all()
    assert any(g.abs().sum() > 0 for g in padded_grads.values())
    for key in ((True, 8), (True, 3)):
        values_NT, metrics, grads = results[key]
        torch.testing.assert_close(values_NT, padded_values, atol=1e-5, rtol=1e-5)
        assert metrics["critic/value_loss"] == pytest.approx(padded_metrics["critic/value_loss"], rel=1e-5)
        for name in padded_grads:
            torch.testing.assert_close(grads[name], padded_grads[name], atol=1e-6, rtol=1e-5, msg=name)


def test_the_packed_critic_reads_one_row():
    model, batch = tiny_value_model(), batch_of_uneven_lengths()
    seen = []
    model.model.register_forward_hook(lambda module, args, kwargs, out: seen.append(kwargs["input_ids"].shape),
                                      with_kwargs=True)
    with torch.no_grad(), attention_for(model, batch.input_ids_NT.shape, pack=True):
        token_values(model, batch)
    assert seen == [torch.Size([1, 3 + 4 + 2 * (1 + 6 + 3 + 9)])]  # each prompt once, no padding


def test_packed_micro_batches_keep_the_samples_of_a_prompt_together():
    batch = batch_of_uneven_lengths()  # sequences 0-3 share one prompt, 4-7 another
    shuffled_N = torch.tensor([4, 0, 5, 1, 6, 2, 7, 3])
    assert [c.tolist() for c in micro_batches(batch, shuffled_N, 4, packed=True)] == [[4, 5, 6, 7], [0, 1, 2, 3]]
    assert [c.tolist() for c in micro_batches(batch, shuffled_N, 3, packed=True)] == [[4, 5, 6], [7, 0, 1], [2, 3]]


def test_packed_micro_batches_filled_up_to_a_number_of_positions_by_hand():
    # Group 0: a 3-token prompt, completions of 1, 6, 3 and 9 tokens (sequences 0-3); group 1 the
    # same after a 4-token prompt (4-7). A row holds a shared prompt once: group 0 is 3 + 19 = 22
    # positions, group 1 is 4 + 19 = 23.
    batch, every_N = batch_of_uneven_lengths(), torch.arange(8)
    assert [c.tolist() for c in micro_batches(batch, every_N, 1, packed=True, max_positions=23)] == [
        [0, 1, 2, 3], [4, 5, 6, 7]]
    # At 12: 4 + 6 = 10 (the next adds 3); 3 + 3 = 6 (the next adds 9); 3 + 9 = 12; 4 + 1 + 6 = 11;
    # 4 + 3 = 7; 4 + 9 = 13 > 12 goes alone. Unpacked micro-batches keep their count of sequences.
    assert [c.tolist() for c in micro_batches(batch, every_N, 8, packed=True, max_positions=12)] == [
        [0, 1], [2], [3], [4, 5], [6], [7]]
    assert sum(len(c) for c in micro_batches(batch, every_N, 8, packed=False, max_positions=12)) == 8
    for chunk in micro_batches(batch, every_N, 8, packed=True, max_positions=12)[:-1]:
        assert packed_positions(batch.select(chunk)) <= 12


def packed_positions(batch) -> int:
    return PackedRow.of(batch.attention_mask_NT, batch.input_ids_NT).source_L.numel()


def test_models_that_cannot_be_packed_are_not():
    model = tiny("llama")
    model.config.sliding_window = 4
    assert not packable(model)


def test_a_sequence_that_is_a_prefix_of_another_has_no_segment_of_its_own():
    # Sequence 1 is sequence 0's first two tokens, sequence 2 a duplicate of it.
    attention_NT = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0]])
    ids_NT = torch.tensor([[5, 6, 7], [5, 6, 0], [5, 6, 0]])
    row = PackedRow.of(attention_NT, ids_NT)
    assert row.pack(ids_NT).tolist() == [[5, 6, 7]]
    assert row.ancestors_of == ((), (0,))
    assert row.index_of(attention_NT.bool()).tolist() == [0, 1, 2, 0, 1, 0, 1]


P, Q = [1, 2, 3, 4, 5], [1, 2, 6, 7]  # two prompts that share their first two tokens
# A tree of completions: the sibling segments A and B both start with 10, 11; the leaf under AB
# that ends early is a prefix of its sibling's sequence.
A, B = [10, 11, 12, 13], [10, 11, 20]
AA, AB, BA, BB = [30, 31, 32, 33, 34, 35], [36, 37], [40, 41, 42, 43], [44, 45, 46]
LEAVES = [A + AA + [50, 51, 52], A + AA + [53, 54, 55, 56, 57], A + AB + [58, 59], A + AB,
          B + BA + [60, 61, 62], B + BA + [17, 18], B + BB + [19, 21, 22, 23], B + BB + [24]]
# Each shared token once, by segment: [1, 2] (all 9 sequences) 2, the rest of P 3, [10, 11] 2,
# A's rest 2, AA 6, its leaves 3 + 5, AB 2, its one leaf with tokens of its own 2, B's rest 1,
# BA 4, its leaves 3 + 2, BB 3, its leaves 4 + 1, and Q's sequence past [1, 2]: 4 - 2 + 3 = 5.
TREE_POSITIONS = 2 + 3 + 2 + 2 + 6 + 3 + 5 + 2 + 2 + 1 + 4 + 3 + 2 + 3 + 4 + 1 + 5


def tree_batch():
    """The 8 leaves after P, then one completion after Q in a left-padded row."""
    def completion(ids):
        return Completion(token_ids=tuple(ids), text="", logprobs=(-1.0,) * len(ids), finish_reason="stop")

    groups = [Group(problem=Problem(id="p", prompt="x", answer="1"), prompt_ids=tuple(P),
                    completions=tuple(completion(leaf) for leaf in LEAVES)),
              Group(problem=Problem(id="q", prompt="y", answer="1"), prompt_ids=tuple(Q),
                    completions=(completion([10, 11, 12]),))]
    batch = make_train_batch(groups, [0.0] * 9, pad_id=0)
    shift = batch.input_ids_NT.shape[1] - len(Q) - 3

    def left_padded(values_NT):
        return torch.cat([values_NT[:-1], values_NT[-1:].roll(shift, 1)])

    return replace(batch, input_ids_NT=left_padded(batch.input_ids_NT),
                   attention_mask_NT=left_padded(batch.attention_mask_NT), loss_mask_NT=left_padded(batch.loss_mask_NT))


def logprobs_and_gradients(model, batch, weights_NT, pack: bool):
    model.zero_grad()
    with attention_for(model, batch.input_ids_NT.shape, pack=pack):
        logp_NT, _ = token_logprobs(model, batch, temperature=0.7)
    (logp_NT * weights_NT).sum().backward()
    return logp_NT.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("long_scores", [packing.LONG_SEGMENT_SCORES, 40])
def test_tree_prefixes_are_packed_once_with_the_log_probs_and_gradients_of_the_separate_sequences(
        monkeypatch, long_scores):
    monkeypatch.setattr(packing, "LONG_SEGMENT_SCORES", long_scores)
    batch = tree_batch()
    row = PackedRow.of(batch.attention_mask_NT, batch.input_ids_NT)
    assert row.source_L.numel() == TREE_POSITIONS == 50
    assert int(batch.attention_mask_NT.sum()) == 18 + 20 + 13 + 11 + 15 + 14 + 15 + 12 + 7  # unshared: 125
    plan = row.attention_plan(4, 2)
    assert plan.buckets and bool(plan.long_segments) == (long_scores == 40)  # with 40: both paths
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                         max_position_embeddings=64))
    model.set_attn_implementation("sdpa")
    weights_NT = torch.rand(batch.loss_mask_NT.shape, generator=torch.Generator().manual_seed(3))
    padded_NT, padded_grads = logprobs_and_gradients(model, batch, weights_NT, pack=False)
    packed_NT, packed_grads = logprobs_and_gradients(model, batch, weights_NT, pack=True)
    mask_NT = batch.loss_mask_NT.bool()
    assert (padded_NT[mask_NT] < -0.5).all()
    torch.testing.assert_close(packed_NT, padded_NT, atol=1e-5, rtol=1e-5)
    assert any(g.abs().sum() > 0 for g in padded_grads.values())
    for name in padded_grads:
        torch.testing.assert_close(packed_grads[name], padded_grads[name], atol=1e-5, rtol=1e-5, msg=name)
    # Micro-batches filled up to a number of positions count them as the row does: Q's sequence adds 5.
    every_N = torch.arange(9)
    assert [len(c) for c in micro_batches(batch, every_N, 9, packed=True, max_positions=50)] == [9]
    assert [len(c) for c in micro_batches(batch, every_N, 9, packed=True, max_positions=49)] == [8, 1]
