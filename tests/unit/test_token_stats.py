"""The fused log-prob / entropy of the sampled token against hand-derived values, autograd's
numerical gradient and the plain log-softmax formulation."""

import math

import pytest
import torch
from helpers import fused_head_against_the_autocast_head, head_problem

from reasonrl.training import token_stats
from reasonrl.training.token_stats import head_logprob_and_entropy, logprob_and_entropy

# p = (1/4, 3/4): logits (0, ln 3) at T = 1, or (0, ln 3 / 2) at T = 1/2.
ENTROPY_QUARTER = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))  # 0.5623


@pytest.mark.parametrize("temperature, logits", [(1.0, [0.0, math.log(3)]), (0.5, [0.0, math.log(3) / 2])])
def test_two_token_distribution_by_hand(temperature, logits):
    logits_KV = torch.tensor([logits], dtype=torch.float64, requires_grad=True)
    logp_K, entropy_K = logprob_and_entropy(logits_KV, torch.tensor([1]), temperature)
    assert logp_K.item() == pytest.approx(math.log(0.75), abs=1e-12)
    assert entropy_K.item() == pytest.approx(ENTROPY_QUARTER, abs=1e-12)
    # d log p(y=1) / dz = onehot - p = (-1/4, 1/4); d / dlogits = that / T.
    (grad_logp,) = torch.autograd.grad(logp_K.sum(), logits_KV, retain_graph=True)
    assert grad_logp.tolist()[0] == pytest.approx([-0.25 / temperature, 0.25 / temperature], abs=1e-12)
    # dH / dz = -p (log p + H): (-(1/4)(ln 1/4 + H), -(3/4)(ln 3/4 + H)) = (+0.2060, -0.2060).
    (grad_entropy,) = torch.autograd.grad(entropy_K.sum(), logits_KV)
    by_hand = [-0.25 * (math.log(0.25) + ENTROPY_QUARTER), -0.75 * (math.log(0.75) + ENTROPY_QUARTER)]
    assert by_hand[0] == pytest.approx(0.2060, abs=1e-4)
    assert grad_entropy.tolist()[0] == pytest.approx([g / temperature for g in by_hand], abs=1e-12)


def test_gradients_of_both_outputs_match_finite_differences(monkeypatch):
    monkeypatch.setattr(token_stats, "CHUNK_ELEMENTS", 20)  # several chunks of 2 rows
    generator = torch.Generator().manual_seed(0)
    logits_KV = (3 * torch.randn(5, 11, generator=generator, dtype=torch.float64)).requires_grad_()
    targets_K = torch.randint(0, 11, (5,), generator=generator)
    weights = torch.randn(2, 5, generator=generator, dtype=torch.float64)

    def weighted(logits):
        logp_K, entropy_K = logprob_and_entropy(logits, targets_K, 0.7)
        return weights[0] @ logp_K + weights[1] @ entropy_K

    assert torch.autograd.gradcheck(weighted, (logits_KV,))
    assert torch.autograd.gradcheck(lambda logits: logprob_and_entropy(logits, targets_K, 0.7)[0], (logits_KV,))
    assert torch.autograd.gradcheck(lambda logits: logprob_and_entropy(logits, targets_K, 0.7)[1], (logits_KV,))


@pytest.mark.parametrize("chunk_elements", [1, 3000, 1 << 19])
def test_bfloat16_logits_match_a_float32_log_softmax_at_any_chunk_size(monkeypatch, chunk_elements):
    monkeypatch.setattr(token_stats, "CHUNK_ELEMENTS", chunk_elements)
    generator = torch.Generator().manual_seed(1)
    logits_KV = (4 * torch.randn(9, 1000, generator=generator)).bfloat16().requires_grad_()
    targets_K = torch.randint(0, 1000, (9,), generator=generator)
    upstream = torch.randn(2, 9, generator=generator)

    logp_K, entropy_K = logprob_and_entropy(logits_KV, targets_K, 0.7)
    (upstream[0] @ logp_K + upstream[1] @ entropy_K).backward()
    fused_grad = logits_KV.grad.clone()
    logits_KV.grad = None
    reference_KV = torch.log_softmax(logits_KV.float() / 0.7, dim=-1)
    reference_logp = reference_KV.gather(1, targets_K[:, None]).squeeze(1)
    reference_entropy = -(reference_KV.exp() * reference_KV).sum(-1)
    (upstream[0] @ reference_logp + upstream[1] @ reference_entropy).backward()

    assert logits_KV.grad.dtype == fused_grad.dtype == torch.bfloat16
    torch.testing.assert_close(logp_K, reference_logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy_K, reference_entropy, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused_grad.float(), logits_KV.grad.float(), atol=1e-2, rtol=1e-2)


def test_adding_a_constant_to_a_row_changes_nothing():
    generator = torch.Generator().manual_seed(2)
    logits_KV = torch.randn(4, 50, generator=generator, dtype=torch.float64)
    targets_K = torch.tensor([0, 7, 49, 3])
    shifted_KV = logits_KV + torch.tensor([[100.0], [-30.0], [0.5], [1e3]], dtype=torch.float64)
    for a, b in zip(logprob_and_entropy(logits_KV, targets_K, 0.9), logprob_and_entropy(shifted_KV, targets_K, 0.9)):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)


def test_large_peaked_logits_keep_the_entropy_accurate_and_non_negative():
    # The entropy is computed from logits shifted by their maximum: unshifted, lse - E[z] would
    # cancel two numbers near 40-60 and lose float32's precision at that scale (~4e-6).
    generator = torch.Generator().manual_seed(3)
    logits_KV = 2 * torch.randn(64, 4096, generator=generator) + 20
    logits_KV[:, 0] = torch.linspace(30, 45, 64)
    logits_KV = logits_KV.bfloat16()
    _, entropy_K = logprob_and_entropy(logits_KV, torch.zeros(64, dtype=torch.long), 0.7)
    reference_KV = torch.log_softmax(logits_KV.double() / 0.7, dim=-1)
    reference_K = -(reference_KV.exp() * reference_KV).sum(-1)
    assert (entropy_K >= 0).all()
    torch.testing.assert_close(entropy_K.double(), reference_K, atol=2e-6, rtol=1e-5)


def test_an_undifferentiated_entropy_adds_no_gradient():
    logits_KV = torch.tensor([[0.0, 1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    logp_K, entropy_K = logprob_and_entropy(logits_KV, torch.tensor([2]))
    (with_entropy_output,) = torch.autograd.grad(logp_K.sum() + 0 * entropy_K.sum(), logits_KV, retain_graph=True)
    (without,) = torch.autograd.grad(logp_K.sum(), logits_KV)
    p = torch.softmax(logits_KV.detach(), -1)[0]
    torch.testing.assert_close(without[0], torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64) - p)
    torch.testing.assert_close(with_entropy_output, without)


# The LM head fused with the softmax: logits = hidden @ weight.T computed a block of rows at a
# time, never saved. It must give the same values and gradients as the head's logits passed to
# logprob_and_entropy, in float64 exactly and under bfloat16 autocast within its rounding.


@pytest.mark.parametrize("block_elements", [1, 13 * 3, 1 << 26])  # a row per block, 3 rows, all rows
def test_fused_head_matches_the_head_then_the_softmax_at_any_block_size(monkeypatch, block_elements):
    monkeypatch.setattr(token_stats, "HEAD_BLOCK_ELEMENTS", block_elements)
    hidden_KH, weight_VH, targets_K, upstream = head_problem(4)

    def gradients(logp_K, entropy_K):
        return torch.autograd.grad(upstream[0] @ logp_K + upstream[1] @ entropy_K, (hidden_KH, weight_VH))

    fused = head_logprob_and_entropy(hidden_KH, weight_VH, targets_K, 0.7)
    unfused = logprob_and_entropy(hidden_KH @ weight_VH.T, targets_K, 0.7)
    for a, b in zip(fused, unfused):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    for a, b in zip(gradients(*fused), gradients(*unfused)):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_fused_head_gradients_match_finite_differences(monkeypatch):
    monkeypatch.setattr(token_stats, "HEAD_BLOCK_ELEMENTS", 13 * 2)
    hidden_KH, weight_VH, targets_K, upstream = head_problem(5, rows=5, hidden=3, vocabulary=13)

    def weighted(hidden, weight):
        logp_K, entropy_K = head_logprob_and_entropy(hidden, weight, targets_K, 1.3)
        return upstream[0] @ logp_K + upstream[1] @ entropy_K

    assert torch.autograd.gradcheck(weighted, (hidden_KH, weight_VH))


def test_fused_head_under_bfloat16_autocast_matches_the_autocast_head(monkeypatch):
    fused_head_against_the_autocast_head(monkeypatch, "cpu")


def test_a_frozen_head_computes_no_weight_gradient_and_the_same_hidden_one(monkeypatch):
    hidden_KH, weight_VH, targets_K, _ = head_problem(7)
    trained_logp_K, _ = head_logprob_and_entropy(hidden_KH, weight_VH, targets_K)
    trained_logp_K.sum().backward()
    # The weight gradient is accumulated into a zeros_like(weight): count those the frozen backward makes.
    zeros_like, weight_shaped = torch.zeros_like, []
    monkeypatch.setattr(torch, "zeros_like", lambda tensor, *args, **kwargs: (
        weight_shaped.append(tensor.shape == weight_VH.shape), zeros_like(tensor, *args, **kwargs))[1])
    frozen_hidden_KH = hidden_KH.detach().clone().requires_grad_()
    frozen_logp_K, _ = head_logprob_and_entropy(frozen_hidden_KH, weight_VH.detach(), targets_K)
    frozen_logp_K.sum().backward()
    assert not any(weight_shaped)
    assert weight_VH.grad is not None and weight_VH.grad.abs().sum() > 0  # the trained head's was computed
    torch.testing.assert_close(frozen_hidden_KH.grad, hidden_KH.grad, atol=1e-12, rtol=0)


def test_no_loss_positions_give_empty_statistics():
    hidden_KH, weight_VH, targets_K, _ = head_problem(8, rows=0)
    logp_K, entropy_K = head_logprob_and_entropy(hidden_KH, weight_VH, targets_K)
    assert logp_K.shape == entropy_K.shape == (0,)


@pytest.mark.parametrize("pack", [True, False])
def test_a_model_with_its_head_fused_gives_the_unfused_log_probs_and_gradients(monkeypatch, pack):
    # Fused only above FUSED_HEAD_MIN_ELEMENTS logits; forced here on a tiny Llama whose head
    # shares the embeddings' weight, so the head's gradient must reach the embedding too.
    from helpers import batch, tiny_llama

    from reasonrl.training.packing import attention_for
    from reasonrl.training.token_stats import token_logprobs

    train_batch = batch()

    def run(fused: bool):
        monkeypatch.setattr(token_stats, "FUSED_HEAD_MIN_ELEMENTS", 0 if fused else 1 << 40)
        monkeypatch.setattr(token_stats, "HEAD_BLOCK_ELEMENTS", 40 * 5)  # 5 rows a block
        model = tiny_llama("off")
        model.config.tie_word_embeddings = True
        model.tie_weights()
        called = []
        real = token_stats._HeadLogprobAndEntropy.apply
        monkeypatch.setattr(token_stats._HeadLogprobAndEntropy, "apply", lambda *a: called.append(1) or real(*a))
        with attention_for(model, train_batch.input_ids_NT.shape, pack=pack):
            logp_NT, entropy_NT = token_logprobs(model, train_batch, 0.7, with_entropy=True, entropy_grad=True)
        (logp_NT.sum() + 0.1 * entropy_NT.sum()).backward()
        assert len(called) == fused
        return logp_NT, entropy_NT, {name: p.grad.clone() for name, p in model.named_parameters()}

    fused, unfused = run(True), run(False)
    torch.testing.assert_close(fused[0], unfused[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(fused[1], unfused[1], atol=1e-6, rtol=1e-6)
    assert fused[2]["model.embed_tokens.weight"].abs().sum() > 0
    for name in unfused[2]:
        torch.testing.assert_close(fused[2][name], unfused[2][name], atol=1e-6, rtol=1e-5, msg=name)
