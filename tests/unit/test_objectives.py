"""Per-token objectives (reasonrl.algo.objectives) against numbers derived by hand from their papers'
equations: REINFORCE, PPO-clip with DAPO's clip-higher and dual clip, GSPO (and LUSPO, GSPO with a
length-summed aggregation), CISPO, GMPO, Clip-Cov and KL-Cov, SAPO's soft gate, DPPO's trust-region
masks (binary total variation and binary KL) and TOPR's tapered weights; and, for every registered
objective, the policy gradient at ratio 1."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import F64, close, t

from reasonrl.algo.aggregation import seq_mean_token_mean, seq_mean_token_sum, token_mean
from reasonrl.algo.objectives import (
    OBJECTIVES,
    cispo,
    clip_cov,
    dppo_kl,
    dppo_tv,
    gmpo,
    gspo,
    kl_cov,
    ppo_clip,
    reinforce,
    sapo,
    topr,
)

OLD = -1.0  # old log-prob of every token below; logp = OLD + log(ratio)


def ppo_case(ratios, advs, mask=None, **clip):
    old = torch.full((1, len(ratios)), OLD, dtype=F64)
    logp = (old + torch.log(t([ratios]))).requires_grad_(True)
    adv = t([advs])
    mask = torch.ones_like(adv) if mask is None else t([mask])
    loss, metrics = ppo_clip(logp, old, adv, mask, **clip)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    return loss.detach()[0], grad[0], metrics


def objective_case(fn, ratios, advs, mask=None, **hyper):
    old = torch.full((len(ratios), len(ratios[0])), OLD, dtype=F64)
    logp = (old + torch.log(t(ratios))).requires_grad_(True)
    mask = torch.ones_like(old) if mask is None else t(mask)
    loss, metrics = fn(logp, old, t(advs), mask, **hyper)
    (grad,) = torch.autograd.grad(seq_mean_token_mean(loss, mask, total_tokens=0, total_sequences=1), logp)
    return loss.detach(), grad, metrics


def gradient(fn, logp, old, adv, mask, **kwargs):
    logp = logp.clone().requires_grad_(True)
    loss, metrics = fn(logp, old, adv, mask, **kwargs)
    (grad,) = torch.autograd.grad((loss * mask).sum(), logp)
    return loss.detach(), grad, metrics


# --------------------------------------------------------------------------- ppo_clip


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


def test_dual_clip_caps_the_loss_of_negative_advantages():
    # c = 3, A = -1: rho 5 -> PPO loss -min(-5, -1.2) = 5 > 3 = -c A -> 3, no gradient;
    # rho 2 -> loss 2 < 3, gradient -A rho / 3 tokens = 2/3; A = +1, rho 5 -> clipped at 1.2 as usual.
    loss, grad, metrics = objective_case(ppo_clip, [[5.0, 2.0, 5.0]], [[-1.0, -1.0, 1.0]], dual_clip=3.0)
    close(loss, [[3.0, 2.0, -1.2]])
    close(grad, [[0.0, 2 / 3, 0.0]])
    assert metrics["dual_clip_frac"].item() == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip(t([[0.0]]), t([[0.0]]), t([[1.0]]), t([[1.0]]), dual_clip=0.5)


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


def test_ppo_clip_gradient_equals_reinforce_at_ratio_one():
    g = torch.Generator().manual_seed(4)
    logp = (-torch.rand(4, 5, generator=g, dtype=F64)).requires_grad_(True)
    adv, mask = torch.randn(4, 5, generator=g, dtype=F64), torch.ones(4, 5, dtype=F64)
    grads = []
    for fn in (ppo_clip, reinforce, cispo):
        loss, _ = fn(logp, logp.detach(), adv, mask)
        grads.append(torch.autograd.grad(token_mean(loss, mask, total_tokens=20, total_sequences=4), logp)[0])
    close(grads[0], grads[1], atol=1e-12)
    close(grads[2], grads[1], atol=1e-12)


# --------------------------------------------------------------------------- sequence ratios: GSPO, LUSPO, GMPO


def test_gspo_ratio_is_the_geometric_mean_and_clips_whole_sequences():
    # sequence 0: ratios [1.1, 0.9] -> s = exp((ln 1.1 + ln 0.9) / 2) = exp(-0.0050252) = 0.994987, inside
    # [0.8, 1.2]: every token's loss is -s A = -0.994987 and, with the sequence's token mean, each token's
    # gradient is -A s / 2 = -0.497494.  Sequence 1: ratios [2, 2] -> s = 2 > 1.2 with A = 1: clipped, no gradient.
    loss, grad, metrics = objective_case(gspo, [[1.1, 0.9], [2.0, 2.0]], [[1.0, 1.0], [1.0, 1.0]],
                                         clip_low=0.2, clip_high=0.2)
    close(loss, [[-0.9949874, -0.9949874], [-1.2, -1.2]])
    close(grad, [[-0.4974937, -0.4974937], [0.0, 0.0]])
    assert metrics["clip_frac"].item() == pytest.approx(0.5)


def test_gspo_on_single_token_sequences_equals_ppo_clip():
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(16, 1, generator=g, dtype=F64) * 2
    logp = (old + (torch.rand(16, 1, generator=g, dtype=F64) - 0.5)).requires_grad_(True)
    adv, mask = torch.randn(16, 1, generator=g, dtype=F64), torch.ones(16, 1, dtype=F64)
    gspo_loss, _ = gspo(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    ppo_loss, _ = ppo_clip(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    close(gspo_loss, ppo_loss, atol=1e-12)
    (g1,) = torch.autograd.grad(gspo_loss.sum(), logp)
    (g2,) = torch.autograd.grad(ppo_loss.sum(), logp)
    close(g1, g2, atol=1e-12)


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


def test_the_luspo_recipe_scales_each_sequence_s_loss_by_its_length():
    # At ratio 1 GSPO's per-token loss is -A; with A = 1 on sequences of 1 and 3 tokens the recipe's
    # loss is (1 x -1 + 3 x -1) / 2 = -2 (a per-token mean per sequence would give -1).
    from reasonrl import load_config
    from reasonrl.build import build_policy_loss
    from reasonrl.recipes import config_path

    policy_loss = build_policy_loss(load_config(config_path("luspo")))
    assert policy_loss.objective is gspo
    logp, mask = t([[-1.0, 0.0, 0.0], [-0.5, -2.0, -1.5]]), t([[1.0, 0, 0], [1.0, 1, 1]])
    per_token, _ = policy_loss.objective(logp, logp, mask.clone(), mask, **policy_loss.objective_kwargs)
    total = policy_loss.aggregation(per_token, mask, total_tokens=4.0, total_sequences=2,
                                    **policy_loss.aggregation_kwargs)
    assert total.item() == pytest.approx(-2.0)


def test_gmpo_geometric_mean_with_log_space_clipping():
    # A = +1, log-ratios [0.5, -0.1], clip 0.4: min(x, clip(x, -0.4, 0.4)) = [0.4, -0.1], mean 0.15,
    # sequence ratio e^0.15 = 1.161834, loss -1.161834 on each token; gradient: the clipped token 0,
    # the other -A e^0.15 / 2 = -0.580917.
    ratios = [[math.exp(0.5), math.exp(-0.1)]]
    loss, grad, _ = objective_case(gmpo, ratios, [[1.0, 1.0]])
    close(loss, [[-1.1618342, -1.1618342]])
    close(grad, [[0.0, -0.5809171]])
    # A = -1: signed log-ratios [-0.5, 0.1] -> min with clip [-0.4, 0.1] keeps [-0.5, 0.1] (pessimistic side):
    # unsigned mean (0.5 - 0.1) / 2 = 0.2, loss +e^0.2 = 1.221403, both gradients e^0.2 / 2 = 0.610701.
    loss, grad, _ = objective_case(gmpo, ratios, [[-1.0, -1.0]])
    close(loss, [[1.2214028, 1.2214028]])
    close(grad, [[0.6107014, 0.6107014]])


def test_gmpo_asymmetric_range_clips_the_log_ratio_itself():
    # A = -1, log-ratios [-0.5, 0.1], clip_low 0.2, clip_high 0.3: clip(x) = [-0.2, 0.1];
    # -min(-x, -clip(x)) = max(x, clip(x)) = [-0.2, 0.1] (token 0 clipped), mean -0.05,
    # loss -A e^-0.05 = 0.951229; gradient: token 0 none, token 1 -A e^-0.05 / 2 = 0.475615.
    # (Clipping the signed log-ratio instead would bound token 0 at -0.3: mean -0.1.)
    loss, grad, metrics = objective_case(gmpo, [[math.exp(-0.5), math.exp(0.1)]], [[-1.0, -1.0]],
                                         clip_low=0.2, clip_high=0.3)
    close(loss, [[0.9512294, 0.9512294]])
    close(grad, [[0.0, 0.4756147]])
    assert metrics["clip_frac"].item() == pytest.approx(0.5)
    # The logged sequence ratio is the unclipped geometric mean: e^((-0.5 + 0.1) / 2) = e^-0.2 = 0.818731.
    assert metrics["seq_ratio_mean"].item() == pytest.approx(0.8187308)


def test_gmpo_counts_no_clipping_in_a_sequence_without_advantage():
    # Row 0: A = 0 and log-ratios [0.5, -0.1] (one beyond the range): no loss, so nothing is clipped.
    # Row 1: A = +1 with the same log-ratios: token 0 clipped. clip_frac = 1 of 4 tokens.
    ratios = [[math.exp(0.5), math.exp(-0.1)], [math.exp(0.5), math.exp(-0.1)]]
    _, _, metrics = objective_case(gmpo, ratios, [[0.0, 0.0], [1.0, 1.0]])
    assert metrics["clip_frac"].item() == pytest.approx(0.25)


# --------------------------------------------------------------------------- CISPO


def test_cispo_weights_the_log_prob_by_the_clipped_ratio():
    # clip_low 1 (no lower bound), clip_high 0.28: rho 2 -> w = 1.28, rho 0.5 -> w = 0.5. A = 1.
    # loss = -w A logp with logp = -1 + ln rho: -1.28 (-0.306853) = 0.392772; -0.5 (-1.693147) = 0.846574.
    # gradient (2 tokens, token mean) -w A / 2 = [-0.64, -0.25]: the clipped token still has one.
    loss, grad, metrics = objective_case(cispo, [[2.0, 0.5]], [[1.0, 1.0]], clip_low=1.0, clip_high=0.28)
    close(loss, [[0.3927718, 0.8465736]])
    close(grad, [[-0.64, -0.25]])
    assert metrics["clip_frac"].item() == pytest.approx(0.5)


# --------------------------------------------------------------------------- Clip-Cov, KL-Cov


def covariance_case():
    # logp [-1, -1, -3, -3] (mean -2), A [2, -2, 2, -2] (mean 0): cov = (logp + 2) A = [2, -2, -2, 2].
    logp = t([[-1.0, -1.0, -3.0, -3.0]]).requires_grad_(True)
    return logp, t([[2.0, -2.0, 2.0, -2.0]]), torch.ones(1, 4, dtype=F64)


def test_clip_cov_detaches_tokens_in_the_covariance_band():
    logp, adv, mask = covariance_case()
    # ratio 1: PPO loss -A = [-2, 2, -2, 2]; tokens 0 and 3 (cov 2 in [1, 5]); share 0.5 of 4 -> both detached.
    loss, metrics = clip_cov(logp, logp.detach(), adv, mask, clip_cov_ratio=0.5, cov_low=1.0, cov_high=5.0)
    close(loss.detach(), [[0.0, 2.0, -2.0, 0.0]])
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    close(grad, [[0.0, 2.0, -2.0, 0.0]])
    assert metrics["cov_detached_frac"].item() == pytest.approx(0.5)
    # share 0.25 -> one of the two, chosen at random; the rest unchanged
    loss, _ = clip_cov(logp, logp.detach(), adv, mask, clip_cov_ratio=0.25, generator=torch.Generator().manual_seed(0))
    zeroed = (loss.detach() == 0).nonzero()[:, 1].tolist()
    assert len(zeroed) == 1 and zeroed[0] in (0, 3)
    assert loss[0, 1].item() == 2.0 and loss[0, 2].item() == -2.0


def test_kl_cov_penalises_the_top_covariance_tokens():
    logp, adv, mask = covariance_case()
    old = logp.detach() - t([[0.1, 0.0, 0.0, -0.2]])  # log-ratios [0.1, 0, 0, -0.2]
    # top 0.5 share by covariance: tokens 0 and 3. loss = -rho A (+ |log rho| on those):
    # token 0: -e^0.1 * 2 + 0.1 = -2.110342; token 1: 2; token 2: -2; token 3: e^-0.2 * 2 + 0.2 = 1.837462.
    loss, metrics = kl_cov(logp, old, adv, mask, kl_cov_ratio=0.5, kl_cov_coef=1.0)
    close(loss.detach(), [[-2.1103418, 2.0, -2.0, 1.8374615]])
    assert metrics["cov_penalised_frac"].item() == pytest.approx(0.5)


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


@pytest.mark.parametrize(("objective", "low", "high"), [(dppo_tv, 0.15, 0.25), (dppo_kl, 0.05, 0.1)])
def test_dppo_bounds_the_rise_of_positive_and_the_fall_of_negative_advantages_apart(objective, low, high):
    # Token 0 (A > 0) rose TV 0.2 / binary KL 0.0871767: within delta_high, kept. Token 2 (A < 0) fell
    # as far: past delta_low, masked. With the two bounds swapped it would be the other way round.
    loss, grad, metrics = gradient(objective, NEW_P, OLD_Q, SIGNS, ALL, dppo_delta_low=low, dppo_delta_high=high)
    close(loss, [[0.4993449, 0.6129907, 0.0, -0.4993449]])  # -1.4 log 0.7, -1.2 log 0.6, 0, +1.4 log 0.7
    close(grad, [[-1.4, -1.2, 0.0, 1.4]])
    assert metrics["clip_frac"].item() == pytest.approx(0.25)


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


# --------------------------------------------------------------------------- every objective


def test_the_registry_names_every_objective_and_each_name_gives_its_equation():
    assert set(OBJECTIVES) == {"reinforce", "ppo_clip", "gspo", "cispo", "gmpo", "clip_cov", "kl_cov", "sapo", "dppo_tv",
                               "dppo_kl", "topr"}
    # Looked up by name: PPO-clip at rho 1.5, A 2 takes the clipped 1.2 A -> loss -2.4 (see above);
    # REINFORCE is -A logp whatever the old log-prob: A 2, logp -0.5 -> loss 1.0.
    loss, _ = OBJECTIVES["ppo_clip"](t([[OLD + math.log(1.5)]]), t([[OLD]]), t([[2.0]]), t([[1.0]]))
    close(loss, [[-2.4]])
    loss, _ = OBJECTIVES["reinforce"](t([[-0.5]]), t([[-9.0]]), t([[2.0]]), t([[1.0]]))
    close(loss, [[1.0]])


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_every_objective_on_policy_takes_the_policy_gradient(name):
    # At ratio 1 (an optimizer step's first pass over fresh samples) every objective's gradient is
    # REINFORCE's: d loss / d logp = -A on each token, so a step raises the log-prob of a sample with
    # A > 0 and lowers it for A < 0; a sign error in any of them flips it. One advantage per sequence
    # (+1.5, -0.5), as the sequence-level ones (GSPO, GMPO, TOPR) take. Equal log-probs put every
    # token's covariance at 0, outside Clip-Cov's band (nothing detached); KL-Cov's |log rho| has no
    # gradient at rho = 1; DPPO's trust regions and TOPR's weights leave every token at weight 1.
    logp = torch.full((2, 3), -1.0, dtype=F64, requires_grad=True)
    adv = t([[1.5, 1.5, 1.5], [-0.5, -0.5, -0.5]])
    loss, _ = OBJECTIVES[name](logp, logp.detach(), adv, torch.ones(2, 3, dtype=F64))
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    close(grad, -adv, atol=1e-12)
