"""The 2025-2026 objectives and estimators by hand: SAPO's soft gate, DPPO's trust-region masks
(binary total variation and binary KL), TOPR's tapered weights, GDPO's decoupled normalisation,
MaxRL's pass-rate weighting, and LUSPO as GSPO with a length-summed aggregation. Each number in
a comment is derived from the paper's equation; the tests compare the functions against them."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.algo.advantages import ADVANTAGES, gdpo, grpo, maxrl
from reasonrl.algo.aggregation import seq_mean_token_mean, seq_mean_token_sum
from reasonrl.algo.objectives import OBJECTIVES, dppo_kl, dppo_tv, gspo, reinforce, sapo, topr

F64 = torch.float64


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, expected if isinstance(expected, torch.Tensor) else t(expected),
                               atol=atol, rtol=0)


def gradient(fn, logp, old, adv, mask, **kwargs):
    logp = logp.clone().requires_grad_(True)
    loss, metrics = fn(logp, old, adv, mask, **kwargs)
    (grad,) = torch.autograd.grad((loss * mask).sum(), logp)
    return loss.detach(), grad, metrics


def test_registered():
    assert {"sapo", "dppo_tv", "dppo_kl", "topr"} <= set(OBJECTIVES)
    assert {"gdpo", "maxrl"} <= set(ADVANTAGES)


# --------------------------------------------------------------------------- SAPO


def test_sapo_soft_gate_by_hand():
    # rho = [1, 1.5, 1.5, 1.5], A = [2, 1, -1, 0]; tau 1 for A > 0, 1.05 otherwise.
    # loss = -(4/tau) sigmoid(tau (rho - 1)) A:
    #   -4 * 0.5 * 2 = -4;  -4 * sigmoid(0.5) = -2.4898373;  (4/1.05) sigmoid(0.525) = 2.3935855;  0.
    # d loss / d logp = -4 s (1 - s) rho A: -2 (REINFORCE's -A at rho = 1); -1.4100223; +1.4012097; 0.
    old = t([[-1.0, -1.0, -1.0, -1.0]])
    logp = old + t([[0.0, math.log(1.5), math.log(1.5), math.log(1.5)]])
    adv, mask = t([[2.0, 1.0, -1.0, 0.0]]), t([[1, 1, 1, 1]])
    loss, grad, metrics = gradient(sapo, logp, old, adv, mask, sapo_tau_pos=1.0, sapo_tau_neg=1.05)
    close(loss, [[-4.0, -2.4898373, 2.3935855, 0.0]])
    close(grad, [[-2.0, -1.4100223, 1.4012097, 0.0]])
    assert metrics["ratio_mean"].item() == pytest.approx(1.375)


def test_sapo_gradient_equals_reinforce_on_policy():
    generator = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 5, generator=generator, dtype=F64)
    adv, mask = torch.randn(3, 5, generator=generator, dtype=F64), torch.ones(3, 5, dtype=F64)
    _, soft, _ = gradient(sapo, logp, logp, adv, mask, sapo_tau_pos=0.7, sapo_tau_neg=2.0)
    _, plain, _ = gradient(reinforce, logp, logp, adv, mask)
    close(soft, plain, atol=1e-12)


def test_sapo_refuses_a_zero_temperature():
    with pytest.raises(ValueError, match="temperatures must be > 0"):
        sapo(t([[0.0]]), t([[0.0]]), t([[1.0]]), t([[1.0]]), sapo_tau_pos=0.0)


# --------------------------------------------------------------------------- DPPO

# q = pi_old(y_t) = 0.5 on every token; p = pi(y_t) = [0.7, 0.6, 0.3, 0.7]; A = [+1, +1, -1, -1].
OLD_Q = t([[math.log(0.5)] * 4])
NEW_P = t([[math.log(0.7), math.log(0.6), math.log(0.3), math.log(0.7)]])
SIGNS = t([[1.0, 1.0, -1.0, -1.0]])
ALL = t([[1, 1, 1, 1]])


def test_dppo_tv_masks_only_moves_past_the_region_in_the_advantage_direction():
    # delta 0.15: token 0 rose 0.2 with A > 0 (masked); token 1 rose 0.1 (kept); token 2 fell 0.2
    # with A < 0 (masked); token 3 rose 0.2 but A < 0 pushes it down, towards the region (kept).
    # Kept: -sg(min(p/q, cap)) A logp: -1.2 * log 0.6 = 0.6129907; -1.4 * -1 * log 0.7 = -0.4993449.
    loss, grad, metrics = gradient(dppo_tv, NEW_P, OLD_Q, SIGNS, ALL, dppo_delta_low=0.15, dppo_delta_high=0.15)
    close(loss, [[0.0, 0.6129907, 0.0, -0.4993449]])
    close(grad, [[0.0, -1.2, 0.0, 1.4]])  # gradient -sg(w) A on kept tokens, 0 on masked ones
    assert metrics["clip_frac"].item() == pytest.approx(0.5)
    # A ratio cap of 1.3 truncates token 3's weight 1.4 (token 1's 1.2 stays).
    _, capped, _ = gradient(dppo_tv, NEW_P, OLD_Q, SIGNS, ALL, dppo_ratio_cap=1.3)
    close(capped, [[0.0, -1.2, 0.0, 1.3]])


def test_dppo_kl_uses_the_binary_kl_of_the_sampled_token():
    # D(q=0.5, p=0.7) = 0.5 log(0.5/0.7) + 0.5 log(0.5/0.3) = 0.0871767 = D(0.5, 0.3);
    # D(0.5, 0.6) = 0.5 log(0.5/0.6) + 0.5 log(0.5/0.4) = 0.0204110. delta 0.05: tokens 0 and 2 are
    # masked (past the region in their advantage's direction), 1 and 3 kept, as with TV above.
    loss, _, metrics = gradient(dppo_kl, NEW_P, OLD_Q, SIGNS, ALL, dppo_delta_low=0.05, dppo_delta_high=0.05)
    close(loss, [[0.0, 0.6129907, 0.0, -0.4993449]])
    # delta 0.09 > 0.0871767: nothing is masked.
    _, _, wide = gradient(dppo_kl, NEW_P, OLD_Q, SIGNS, ALL, dppo_delta_low=0.09, dppo_delta_high=0.09)
    assert metrics["clip_frac"].item() == pytest.approx(0.5) and wide["clip_frac"].item() == 0.0


# --------------------------------------------------------------------------- TOPR


def test_topr_tapers_only_the_negative_sequences():
    # Sequence log-ratios to the sampler: +0.5 (A = +1), -0.7 (A = -1), +0.3 (A = -1).
    # Weights: 1 (positive: no importance weight); exp(-0.7) = 0.4965853; min(exp(0.3), 1) = 1.
    logp = t([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    sampling = logp - t([[0.25, 0.25], [-0.35, -0.35], [0.15, 0.15]])
    adv = t([[1.0, 1.0], [-1.0, -1.0], [-1.0, -1.0]])
    mask = t([[1, 1], [1, 1], [1, 1]])
    _, grad, metrics = gradient(topr, logp, logp, adv, mask, sampling_logp_NT=sampling)
    close(grad, [[-1.0, -1.0], [0.4965853, 0.4965853], [1.0, 1.0]])  # -w A
    assert metrics["seq_weight_mean"].item() == pytest.approx((1 + 0.4965853 + 1) / 3)
    # Without the sampler's log-probs the anchor is pi_old, here the policy itself: every weight 1.
    _, anchored, _ = gradient(topr, logp, logp, adv, mask)
    close(anchored, -adv)


# --------------------------------------------------------------------------- GDPO, MaxRL


def test_gdpo_normalises_each_component_then_the_batch():
    # One group of 4: correct [1, 0, 0, 1], format [1, 1, 0, 0], weights 1 and 0.5.
    # Each component's group z-score: +-sqrt(3)/2 = +-0.8660254 (std of two 1s and two 0s is sqrt(1/3)).
    # Sum: [1.2990381, -0.4330127, -1.2990381, 0.4330127]; batch std sqrt(1.25): divided -> [1.1618950,
    # -0.3872983, -1.1618950, 0.3872983].
    components = t([[[1.0, 0.0, 0.0, 1.0]], [[1.0, 1.0, 0.0, 0.0]]])
    weights = t([1.0, 0.5])
    totals = (components * weights[:, None, None]).sum(0)
    adv = gdpo(totals, components_KBG=components, weights_K=weights, eps=0.0)
    close(adv, [[1.1618950, -0.3872983, -1.1618950, 0.3872983]])
    # GRPO on the total ranks the wrong-but-formatted sample (0.5) above nothing and below the right
    # one without format (1): the same order, but GDPO's gaps follow the weights, not the spreads.
    assert torch.argsort(adv[0]).tolist() == torch.argsort(grpo(totals)[0]).tolist()


def test_gdpo_weighs_a_component_by_its_weight_not_its_spread():
    # a = [1, 1, 0, 0]; b = [0, -50, 150, 100] has ~100 times a's spread. GRPO on a + b = [1, -49, 150, 100]
    # follows b alone: sample 0 (a right, b middling) below sample 3 (a wrong, b high). GDPO with equal
    # weights: z(a) = [0.866, 0.866, -0.866, -0.866], z(b) = [-0.548, -1.095, 1.095, 0.548] (b's mean 50,
    # std 91.29), sum [0.318, -0.229, 0.229, -0.318]: sample 0 now above sample 3.
    a, b = t([[1.0, 1.0, 0.0, 0.0]]), t([[0.0, -50.0, 150.0, 100.0]])
    adv = gdpo(a + b, components_KBG=torch.stack([a, b]), weights_K=t([1.0, 1.0]), eps=0.0)
    plain = grpo(a + b, eps=0.0)
    assert plain[0, 0].item() < plain[0, 3].item() and adv[0, 0].item() > adv[0, 3].item()
    summed = 0.8660254 * t([1, 1, -1, -1]) + t([-50.0, -100.0, 100.0, 50.0]) / math.sqrt(25000 / 3)
    close(adv, (summed / summed.std())[None], atol=1e-6)


def test_gdpo_refuses_mismatched_weights():
    with pytest.raises(ValueError, match="2 reward components for 1 weights"):
        gdpo(t([[1.0, 0.0]]), components_KBG=t([[[1.0, 0.0]], [[0.0, 1.0]]]), weights_K=t([1.0]))


def test_maxrl_divides_by_the_pass_rate():
    # [1, 0, 0, 0]: p = 0.25 -> (r - p) / p = [3, -1, -1, -1]; [1, 1, 1, 0]: p = 0.75 -> [1/3, 1/3, 1/3, -1];
    # nothing right: 0. GRPO would give the two non-trivial groups mirror-image magnitudes.
    adv = maxrl(t([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    close(adv, [[3.0, -1.0, -1.0, -1.0], [1 / 3, 1 / 3, 1 / 3, -1.0], [0.0, 0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="negative rewards"):
        maxrl(t([[1.0, -1.0]]))


# --------------------------------------------------------------------------- LUSPO


def test_luspo_is_gspo_summed_over_each_sequence():
    # LUSPO (Liu et al. 2026): GSPO's sequence loss times the sequence's length. GSPO writes its
    # sequence loss on every token, so the per-sequence token sum is |y_i| times it: the gradient of
    # a sequence under seq_mean_token_sum is |y_i| times its gradient under seq_mean_token_mean.
    generator = torch.Generator().manual_seed(1)
    old = -torch.rand(2, 4, generator=generator, dtype=F64)
    logp = (old + 1e-4 * torch.randn(2, 4, generator=generator, dtype=F64)).requires_grad_(True)
    adv, mask = t([[1.0] * 4, [-2.0] * 4]), t([[1, 1, 1, 0], [1, 1, 1, 1]])
    loss, _ = gspo(logp, old, adv, mask)
    (summed,) = torch.autograd.grad(seq_mean_token_sum(loss, mask, total_tokens=7, total_sequences=2), logp)
    loss, _ = gspo(logp, old, adv, mask)
    (averaged,) = torch.autograd.grad(seq_mean_token_mean(loss, mask, total_tokens=7, total_sequences=2), logp)
    close(summed, averaged * mask.sum(dim=1, keepdim=True), atol=1e-12)
