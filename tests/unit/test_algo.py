"""Advantages, objectives, aggregation and KL estimators against numbers derived by hand
from the papers' equations (GRPO, PPO / DAPO clip-higher, REINFORCE, Schulman's k1/k2/k3)."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.algo.advantages import ADVANTAGES, grpo
from reasonrl.algo.aggregation import AGGREGATIONS, token_mean
from reasonrl.algo.kl import KL_ESTIMATORS, k1, k2, k3
from reasonrl.algo.objectives import OBJECTIVES, ppo_clip, reinforce

F64 = torch.float64


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


# --------------------------------------------------------------------------- grpo


@pytest.mark.parametrize("eps", [0.0, 1e-6])
def test_grpo_two_right_two_wrong(eps):
    # r = [1, 0, 0, 1]: mean 0.5, deviations +-0.5, sum of squares 4 * 0.25 = 1,
    # unbiased variance 1 / (4 - 1) = 1/3, std sqrt(1/3) = 0.577350,
    # A = +-0.5 / 0.577350 = +-0.866025 (eps=1e-6 moves it by ~1.5e-6).
    adv = grpo(t([[1.0, 0.0, 0.0, 1.0]]), eps=eps)
    expected = t([[0.8660254, -0.8660254, -0.8660254, 0.8660254]])
    torch.testing.assert_close(adv, expected, atol=1e-5 if eps else 1e-7, rtol=0)


def test_grpo_one_right_of_four():
    # r = [1, 0, 0, 0]: mean 0.25, deviations [0.75, -0.25, -0.25, -0.25],
    # sum of squares 0.5625 + 3 * 0.0625 = 0.75, unbiased variance 0.75 / 3 = 0.25, std 0.5,
    # A = [1.5, -0.5, -0.5, -0.5].
    adv = grpo(t([[1.0, 0.0, 0.0, 0.0]]), eps=0.0)
    torch.testing.assert_close(adv, t([[1.5, -0.5, -0.5, -0.5]]))


def test_grpo_equal_rewards_give_zero():
    # r = [0.3, 0.3, 0.3]: r - mean = 0 and std = 0, so A = 0 / (0 + eps) = 0.
    adv = grpo(t([[0.3, 0.3, 0.3], [1.0, 1.0, 1.0]]))
    assert torch.equal(adv, torch.zeros(2, 3, dtype=F64))


def test_grpo_equal_rewards_with_zero_eps_are_finite():
    adv = grpo(t([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 1.0]]), eps=0.0)
    assert torch.isfinite(adv).all()
    assert torch.equal(adv[0], torch.zeros(4, dtype=F64))


def test_grpo_groups_are_normalised_independently():
    # group 0: [1, 0, 0, 1] -> +-0.866025 (see above).
    # group 1: [2, 4, 6, 8]: mean 5, deviations [-3, -1, 1, 3], sum of squares 20,
    # unbiased variance 20/3 = 6.666667, std 2.581989, A = [-1.161895, -0.387298, 0.387298, 1.161895].
    adv = grpo(t([[1.0, 0.0, 0.0, 1.0], [2.0, 4.0, 6.0, 8.0]]), eps=0.0)
    expected = t([[0.8660254, -0.8660254, -0.8660254, 0.8660254],
                  [-1.1618950, -0.3872983, 0.3872983, 1.1618950]])
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)
    # each row alone gives the same advantages as in the batch
    torch.testing.assert_close(grpo(t([[2.0, 4.0, 6.0, 8.0]]), eps=0.0), expected[1:])


def test_grpo_invariant_to_shift_and_scale_of_a_group():
    rewards = t([[0.0, 1.0, 0.5, 0.2], [3.0, -1.0, 2.0, 0.0]])
    shifted = rewards.clone()
    shifted[1] = 10.0 * shifted[1] - 7.0  # affects group 1 only; z-scores are unchanged
    torch.testing.assert_close(grpo(shifted, eps=0.0), grpo(rewards, eps=0.0))


def test_grpo_single_sample_groups_give_zero_not_nan():
    # G = 1: r - mean = 0, the std of one sample is undefined (torch.std -> NaN); A must be 0.
    adv = grpo(t([[1.0], [0.0], [5.0]]))
    assert torch.equal(adv, torch.zeros(3, 1, dtype=F64))


def test_grpo_advantages_sum_to_zero_per_group():
    adv = grpo(t([[0.1, 0.9, 0.4, 0.4, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0]]))
    torch.testing.assert_close(adv.sum(dim=1), torch.zeros(2, dtype=F64), atol=1e-12, rtol=0)


# --------------------------------------------------------------------------- ppo_clip

OLD = -1.0  # old log-prob of every token below; logp = OLD + log(ratio)


def ppo_case(ratios, advs, mask=None, **clip):
    old = torch.full((1, len(ratios)), OLD, dtype=F64)
    logp = (old + torch.log(t([ratios]))).requires_grad_(True)
    adv = t([advs])
    mask = torch.ones_like(adv) if mask is None else t([mask])
    loss, metrics = ppo_clip(logp, old, adv, mask, **clip)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    return loss.detach()[0], grad[0], metrics


def test_ppo_clip_positive_advantage():
    # clip_low = clip_high = 0.2, A = +2, loss = -min(rho*A, clip(rho, 0.8, 1.2)*A):
    #   rho 1.5: min(3.0, 1.2*2 = 2.4) = 2.4 -> loss -2.4, clipped: d loss/d logp = 0
    #   rho 1.1: min(2.2, 2.2) = 2.2         -> loss -2.2, d/d logp (rho = e^(logp-old)) = -A*rho = -2.2
    #   rho 0.5: min(1.0, 0.8*2 = 1.6) = 1.0 -> loss -1.0, not clipped (min picks rho*A), grad -A*rho = -1.0
    loss, grad, metrics = ppo_case([1.5, 1.1, 0.5], [2.0, 2.0, 2.0], clip_low=0.2, clip_high=0.2)
    torch.testing.assert_close(loss, t([-2.4, -2.2, -1.0]))
    torch.testing.assert_close(grad, t([0.0, -2.2, -1.0]))
    # only rho 1.5 is clipped: 1/3
    assert metrics["clip_frac"].item() == pytest.approx(1 / 3)


def test_ppo_clip_negative_advantage():
    # A = -1, clip range [0.8, 1.2]:
    #   rho 0.5: min(-0.5, 0.8*-1 = -0.8) = -0.8 -> loss 0.8, clipped: grad 0
    #   rho 1.1: min(-1.1, -1.1) = -1.1         -> loss 1.1, grad -A*rho = 1.1
    #   rho 1.5: min(-1.5, 1.2*-1 = -1.2) = -1.5 -> loss 1.5, not clipped, grad -A*rho = 1.5
    loss, grad, metrics = ppo_case([0.5, 1.1, 1.5], [-1.0, -1.0, -1.0], clip_low=0.2, clip_high=0.2)
    torch.testing.assert_close(loss, t([0.8, 1.1, 1.5]))
    torch.testing.assert_close(grad, t([0.0, 1.1, 1.5]))
    assert metrics["clip_frac"].item() == pytest.approx(1 / 3)


def test_ppo_clip_ratio_one_is_the_policy_gradient():
    # rho = 1 (on-policy): loss = -A, grad = -A * 1 for any A
    loss, grad, metrics = ppo_case([1.0, 1.0, 1.0], [3.0, -0.5, 0.0])
    torch.testing.assert_close(loss, t([-3.0, 0.5, 0.0]))
    torch.testing.assert_close(grad, t([-3.0, 0.5, 0.0]))
    assert metrics["clip_frac"].item() == 0.0
    assert metrics["ratio_mean"].item() == pytest.approx(1.0)


def test_ppo_clip_asymmetric_range_distinguishes_the_two_sides():
    # tokens: (rho 1.25, A +1) and (rho 0.75, A -1)
    # clip_low 0.2, clip_high 0.28 -> range [0.8, 1.28]:
    #   rho 1.25 < 1.28: inside, loss -1.25, grad -1.25
    #   rho 0.75 < 0.8, A < 0: min(-0.75, -0.8) = -0.8 -> loss 0.8, clipped, grad 0
    loss, grad, metrics = ppo_case([1.25, 0.75], [1.0, -1.0], clip_low=0.2, clip_high=0.28)
    torch.testing.assert_close(loss, t([-1.25, 0.8]))
    torch.testing.assert_close(grad, t([-1.25, 0.0]))
    assert metrics["clip_frac"].item() == pytest.approx(0.5)
    # swapped: clip_low 0.28, clip_high 0.2 -> range [0.72, 1.2]:
    #   rho 1.25 > 1.2, A > 0: min(1.25, 1.2) = 1.2 -> loss -1.2, clipped, grad 0
    #   rho 0.75 > 0.72: inside, loss 0.75, grad -A*rho = 0.75
    loss, grad, metrics = ppo_case([1.25, 0.75], [1.0, -1.0], clip_low=0.28, clip_high=0.2)
    torch.testing.assert_close(loss, t([-1.2, 0.75]))
    torch.testing.assert_close(grad, t([0.0, 0.75]))
    assert metrics["clip_frac"].item() == pytest.approx(0.5)


def test_ppo_clip_defaults_are_symmetric_0_2():
    # rho 1.25, A 1: default clip_high 0.2 clips to 1.2 -> loss -1.2
    loss, _, _ = ppo_case([1.25, 0.75], [1.0, -1.0])
    torch.testing.assert_close(loss, t([-1.2, 0.8]))


def test_ppo_clip_metrics_count_only_masked_tokens():
    # N=2, T=3, clip range [0.8, 1.2]:
    #   row 0: (1.5, +2) clipped, (1.1, +2) no, (0.5, -1) clipped
    #   row 1: (1.5, -1) no, (0.5, +2) no, (1.5, +2) clipped but masked out
    # clip_frac = 2 clipped / 5 masked = 0.4
    # ratio_mean = (1.5 + 1.1 + 0.5 + 1.5 + 0.5) / 5 = 5.1 / 5 = 1.02
    ratios = t([[1.5, 1.1, 0.5], [1.5, 0.5, 1.5]])
    old = torch.full((2, 3), OLD, dtype=F64)
    adv = t([[2.0, 2.0, -1.0], [-1.0, 2.0, 2.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    loss, metrics = ppo_clip(old + torch.log(ratios), old, adv, mask, clip_low=0.2, clip_high=0.2)
    assert metrics["clip_frac"].item() == pytest.approx(0.4)
    assert metrics["ratio_mean"].item() == pytest.approx(1.02)
    # loss itself is per token and unmasked: -[2.4, 2.2, -0.8], -[-1.5, 1.0, 2.4]
    torch.testing.assert_close(loss, t([[-2.4, -2.2, 0.8], [1.5, -1.0, -2.4]]))


def test_ppo_clip_gradient_matches_formula_on_random_tokens():
    # d loss / d logp = -A * rho where the unclipped term is taken, 0 where the clipped one is
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 16, generator=g, dtype=F64) * 3
    logp = (old + (torch.rand(4, 16, generator=g, dtype=F64) - 0.5)).requires_grad_(True)
    adv = torch.randn(4, 16, generator=g, dtype=F64)
    loss, _ = ppo_clip(logp, old, adv, torch.ones_like(adv), clip_low=0.2, clip_high=0.28)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    rho = torch.exp(logp.detach() - old)
    clipped = ((adv > 0) & (rho > 1.28)) | ((adv < 0) & (rho < 0.8))
    assert 0 < clipped.sum() < clipped.numel()  # both cases are exercised
    expected = torch.where(clipped, torch.zeros_like(rho), -adv * rho)
    torch.testing.assert_close(grad, expected)


# --------------------------------------------------------------------------- reinforce


def test_reinforce_loss_and_gradient():
    # loss = -A * logp: A=[2, -1, 0.5], logp=[-0.5, -2, -1] -> [1.0, -2.0, 0.5]; grad = -A = [-2, 1, -0.5]
    logp = t([[-0.5, -2.0, -1.0]]).requires_grad_(True)
    old = t([[-9.0, -9.0, -9.0]])  # ignored: no importance ratio
    adv = t([[2.0, -1.0, 0.5]])
    loss, metrics = reinforce(logp, old, adv, torch.ones_like(adv))
    torch.testing.assert_close(loss.detach(), t([[1.0, -2.0, 0.5]]))
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    torch.testing.assert_close(grad, t([[-2.0, 1.0, -0.5]]))
    assert metrics == {}


# --------------------------------------------------------------------------- token_mean


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


# --------------------------------------------------------------------------- KL


def test_kl_estimators_hand_values():
    # d = ref - logp.
    # logp -1, ref -2: d = -1 -> k1 = -d = 1, k2 = d^2/2 = 0.5, k3 = e^-1 + 1 - 1 = 0.367879
    # logp -2, ref -1: d = +1 -> k1 = -1,      k2 = 0.5,        k3 = e^1 - 1 - 1 = 0.718282
    logp, ref = t([[-1.0, -2.0]]), t([[-2.0, -1.0]])
    torch.testing.assert_close(k1(logp, ref), t([[1.0, -1.0]]))
    torch.testing.assert_close(k2(logp, ref), t([[0.5, 0.5]]))
    torch.testing.assert_close(k3(logp, ref), t([[0.36787944, 0.71828183]]))


def test_kl_estimators_are_zero_when_equal():
    x = t([[-0.1, -3.0, -7.5]])
    for fn in (k1, k2, k3):
        assert torch.equal(fn(x, x.clone()), torch.zeros_like(x))


def test_k3_is_nonnegative_everywhere():
    grid = torch.linspace(-20, 0, 81, dtype=F64)
    logp, ref = torch.meshgrid(grid, grid, indexing="ij")
    assert (k3(logp, ref) >= 0).all()
    assert (k2(logp, ref) >= 0).all()


def test_k1_and_k3_are_unbiased_estimators_of_kl():
    # p = [0.5, 0.5], ref = [0.25, 0.75]:
    # KL(p || ref) = 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5*0.693147 - 0.5*0.405465 = 0.143841
    # E_p[k3] = E_p[ref/p] - E_p[d] - 1 = 1 + KL - 1 = KL; E_p[k1] = E_p[log p - log ref] = KL.
    p, ref = t([0.5, 0.5]), t([0.25, 0.75])
    kl = 0.5 * math.log(2.0) + 0.5 * math.log(2.0 / 3.0)
    assert kl == pytest.approx(0.143841, abs=1e-6)
    for fn in (k1, k3):
        assert (p * fn(p.log(), ref.log())).sum().item() == pytest.approx(kl)


# --------------------------------------------------------------------------- registries


def test_registries_contain_the_built_in_names():
    assert ADVANTAGES["grpo"] is grpo
    assert OBJECTIVES["ppo_clip"] is ppo_clip
    assert OBJECTIVES["reinforce"] is reinforce
    assert AGGREGATIONS["token_mean"] is token_mean
    assert KL_ESTIMATORS["k1"] is k1
    assert KL_ESTIMATORS["k2"] is k2
    assert KL_ESTIMATORS["k3"] is k3
