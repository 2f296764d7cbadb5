"""The algorithm families beyond GRPO (advantage estimators, objectives, aggregations, the
adaptive KL coefficient and rollout-mismatch weights) against numbers derived by hand from
their papers' equations, plus the invariances that tie them together."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.algo.advantages import (
    ADVANTAGES,
    discounted_returns,
    dr_grpo,
    gae,
    grpo,
    grpo_batch_std,
    is_token_level,
    lambda_returns,
    opo,
    reinforce_pp,
    reinforce_pp_baseline,
    remax,
    rloo,
    token_rewards,
)
from reasonrl.algo.aggregation import (
    AGGREGATIONS,
    seq_mean_token_mean,
    seq_mean_token_sum,
    seq_mean_token_sum_norm,
    token_mean,
)
from reasonrl.algo.correction import truncated_is_weights
from reasonrl.algo.kl import AdaptiveKLCoef
from reasonrl.algo.objectives import (
    OBJECTIVES,
    cispo,
    clip_cov,
    gmpo,
    gspo,
    kl_cov,
    ppo_clip,
    reinforce,
)

F64 = torch.float64


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, t(expected) if not isinstance(expected, torch.Tensor) else expected,
                               atol=atol, rtol=0)


# --------------------------------------------------------------------------- group estimators


def test_grpo_batch_std_divides_by_the_batch_std():
    # groups [1, 0] and [1, 1]: group-centred [[0.5, -0.5], [0, 0]].
    # all rewards [1, 0, 1, 1]: mean 0.75, squares 0.0625 + 0.5625 + 0.0625 + 0.0625 = 0.75,
    # unbiased variance 0.75 / 3 = 0.25, std 0.5 -> A = [[1, -1], [0, 0]].
    close(grpo_batch_std(t([[1.0, 0.0], [1.0, 1.0]]), eps=0.0), [[1.0, -1.0], [0.0, 0.0]])


def test_dr_grpo_only_subtracts_the_group_mean():
    close(dr_grpo(t([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 1.0, 1.0]])), [[0.5, -0.5, -0.5, 0.5], [1.5, -0.5, -0.5, -0.5]])


def test_rloo_leave_one_out_by_hand():
    # [1, 0, 0, 0]: A_0 = 1 - mean(0, 0, 0) = 1; A_j = 0 - mean(1, 0, 0) = -1/3.
    close(rloo(t([[1.0, 0.0, 0.0, 0.0]])), [[1.0, -1 / 3, -1 / 3, -1 / 3]])
    close(rloo(t([[5.0]])), [[0.0]])  # no other sample: no signal


def test_rloo_is_group_centred_times_g_over_g_minus_1():
    rewards = torch.rand(3, 6, generator=torch.Generator().manual_seed(0), dtype=F64)
    close(rloo(rewards), dr_grpo(rewards) * 6 / 5, atol=1e-12)


def test_reinforce_pp_baseline_whitens_over_samples():
    # centred [[0.5, -0.5], [0, 0]]: mean 0, unbiased variance (0.25 + 0.25) / 3 = 1/6,
    # std 0.408248 -> [[1.224745, -1.224745], [0, 0]].
    close(reinforce_pp_baseline(t([[1.0, 0.0], [1.0, 1.0]])), [[1.2247449, -1.2247449], [0.0, 0.0]])


def test_reinforce_pp_baseline_weights_samples_by_their_tokens():
    # centred [[0.5, -0.5], [0, 0]] with token counts [[3, 1], [1, 1]] (6 tokens):
    # mean (3 * 0.5 - 0.5) / 6 = 1/6; variance (3 (1/3)^2 + (2/3)^2 + 2 (1/6)^2) / 5 = (15/18) / 5 = 1/6,
    # std 0.408248 -> [(0.5 - 1/6), (-0.5 - 1/6), -1/6, -1/6] / 0.408248.
    out = reinforce_pp_baseline(t([[1.0, 0.0], [1.0, 1.0]]), lengths_BG=torch.tensor([[3, 1], [1, 1]]))
    close(out, [[0.8164966, -1.6329932], [-0.4082483, -0.4082483]])


def test_remax_subtracts_the_greedy_reward():
    close(remax(t([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]]), greedy_rewards_B=t([1.0, 0.0])),
          [[0.0, -1.0, 0.0], [0.0, 0.0, 1.0]])


def test_opo_baseline_is_length_weighted():
    # b = (10 * 1 + 30 * 0) / 40 = 0.25 -> A = [0.75, -0.25] (the plain mean would give +-0.5).
    close(opo(t([[1.0, 0.0]]), lengths_BG=torch.tensor([[10, 30]])), [[0.75, -0.25]])


def test_opo_with_equal_lengths_is_dr_grpo():
    rewards = torch.rand(2, 5, generator=torch.Generator().manual_seed(1), dtype=F64)
    close(opo(rewards, lengths_BG=torch.full((2, 5), 7)), dr_grpo(rewards), atol=1e-12)


# --------------------------------------------------------------------------- token estimators


def test_token_rewards_put_the_outcome_on_the_last_token_and_kl_on_every_token():
    # rows of 3 and 2 completion tokens (row 1 ends at position 1), KL coefficient 0.1:
    # row 0: [-0.01, -0.02, 1 - 0.03]; row 1: [-0.05, 2 - 0.05, 0 (padding)].
    mask = t([[1, 1, 1], [1, 1, 0]])
    kl = t([[0.1, 0.2, 0.3], [0.5, 0.5, 0.5]])
    close(token_rewards(t([1.0, 2.0]), mask, kl, kl_coef=0.1), [[-0.01, -0.02, 0.97], [-0.05, 1.95, 0.0]])
    # a mask that starts after the prompt: the last completion token is still the reward's place
    close(token_rewards(t([1.0]), t([[0, 0, 1, 1, 0]])), [[0.0, 0.0, 0.0, 1.0, 0.0]])


def test_discounted_returns_by_hand():
    # gamma 0.5, rewards [0, 0, 1]: G = [0.25, 0.5, 1]. A masked-out token in the middle is skipped:
    # rewards [0.1, (9), 1], mask [1, 0, 1]: G_2 = 1, G_0 = 0.1 + 0.5 * 1 = 0.6, G_1 = 0.
    close(discounted_returns(t([[0.0, 0.0, 1.0]]), t([[1, 1, 1]]), gamma=0.5), [[0.25, 0.5, 1.0]])
    close(discounted_returns(t([[0.1, 9.0, 1.0]]), t([[1, 0, 1]]), gamma=0.5), [[0.6, 0.0, 1.0]])


def test_reinforce_pp_whitens_returns_over_all_tokens():
    # row 0: rewards [0, 0, 1] -> returns [1, 1, 1]; row 1 (2 tokens): rewards [0, 0] -> [0, 0].
    # 5 tokens [1, 1, 1, 0, 0]: mean 0.6, unbiased variance (3 * 0.16 + 2 * 0.36) / 4 = 0.3,
    # std 0.547723 -> [0.730297 x 3, -1.095445 x 2]; padding stays 0.
    mask = t([[1, 1, 1], [1, 1, 0]])
    out = reinforce_pp(t([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]), mask)
    close(out, [[0.7302967, 0.7302967, 0.7302967], [-1.0954451, -1.0954451, 0.0]])


def test_gae_by_hand():
    # rewards [0, 1], values [0.5, 0.8], gamma 1, lambda 0.5:
    # delta_1 = 1 + 0 - 0.8 = 0.2, A_1 = 0.2; delta_0 = 0 + 0.8 - 0.5 = 0.3, A_0 = 0.3 + 0.5 * 0.2 = 0.4.
    # returns A + V = [0.9, 1.0]; whitened [0.4, 0.2]: mean 0.3, std sqrt(0.02) -> [+0.707107, -0.707107].
    rewards, values = t([[0.0, 1.0]]), t([[0.5, 0.8]])
    close(lambda_returns(rewards, t([[1, 1]]), values_NT=values, gamma=1.0, lam=0.5), [[0.9, 1.0]])
    close(gae(rewards, t([[1, 1]]), values_NT=values, gamma=1.0, lam=0.5), [[0.7071068, -0.7071068]])
    # the same with a masked-out token between them (its value and reward are ignored)
    gapped = lambda_returns(t([[0.0, 5.0, 1.0]]), t([[1, 0, 1]]), values_NT=t([[0.5, 9.9, 0.8]]), gamma=1.0, lam=0.5)
    close(gapped, [[0.9, 0.0, 1.0]])


def test_gae_with_lambda_one_is_monte_carlo_return_minus_value():
    g = torch.Generator().manual_seed(2)
    rewards, values = torch.randn(3, 6, generator=g, dtype=F64), torch.randn(3, 6, generator=g, dtype=F64)
    mask = t([[1] * 6, [1] * 4 + [0] * 2, [0, 1, 1, 1, 1, 0]])
    returns = lambda_returns(rewards, mask, values_NT=values, gamma=0.9, lam=1.0)
    close(returns, discounted_returns(rewards, mask, gamma=0.9), atol=1e-12)


def test_estimators_are_told_apart_by_their_inputs():
    assert {name for name, fn in ADVANTAGES.items() if is_token_level(fn)} == {"reinforce_pp", "gae"}


# --------------------------------------------------------------------------- objectives

OLD = -1.0


def objective_case(fn, ratios, advs, mask=None, **hyper):
    old = torch.full((len(ratios), len(ratios[0])), OLD, dtype=F64)
    logp = (old + torch.log(t(ratios))).requires_grad_(True)
    mask = torch.ones_like(old) if mask is None else t(mask)
    loss, metrics = fn(logp, old, t(advs), mask, **hyper)
    (grad,) = torch.autograd.grad(seq_mean_token_mean(loss, mask, total_tokens=0, total_sequences=1), logp)
    return loss.detach(), grad, metrics


def test_dual_clip_caps_the_loss_of_negative_advantages():
    # c = 3, A = -1: rho 5 -> PPO loss -min(-5, -1.2) = 5 > 3 = -c A -> 3, no gradient;
    # rho 2 -> loss 2 < 3, gradient -A rho / 3 tokens = 2/3; A = +1, rho 5 -> clipped at 1.2 as usual.
    loss, grad, metrics = objective_case(ppo_clip, [[5.0, 2.0, 5.0]], [[-1.0, -1.0, 1.0]], dual_clip=3.0)
    close(loss, [[3.0, 2.0, -1.2]])
    close(grad, [[0.0, 2 / 3, 0.0]])
    assert metrics["dual_clip_frac"].item() == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_clip(t([[0.0]]), t([[0.0]]), t([[1.0]]), t([[1.0]]), dual_clip=0.5)


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


def test_cispo_weights_the_log_prob_by_the_clipped_ratio():
    # clip_low 1 (no lower bound), clip_high 0.28: rho 2 -> w = 1.28, rho 0.5 -> w = 0.5. A = 1.
    # loss = -w A logp with logp = -1 + ln rho: -1.28 (-0.306853) = 0.392772; -0.5 (-1.693147) = 0.846574.
    # gradient (2 tokens, token mean) -w A / 2 = [-0.64, -0.25]: the clipped token still has one.
    loss, grad, metrics = objective_case(cispo, [[2.0, 0.5]], [[1.0, 1.0]], clip_low=1.0, clip_high=0.28)
    close(loss, [[0.3927718, 0.8465736]])
    close(grad, [[-0.64, -0.25]])
    assert metrics["clip_frac"].item() == pytest.approx(0.5)


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


def test_truncated_is_weights_token_and_sequence():
    # learner - sampler log-ratios [0.5, -0.5]: token weights [e^0.5 = 1.648721 -> cap 1.5, e^-0.5 = 0.606531];
    # sequence: the log-ratios sum to 0 -> weight 1 on both tokens; padding gets 0.
    old, sampling, mask = t([[-1.0, -1.0, 0.0]]), t([[-1.5, -0.5, 3.0]]), t([[1, 1, 0]])
    close(truncated_is_weights(old, sampling, mask, cap=1.5), [[1.5, 0.6065307, 0.0]])
    close(truncated_is_weights(old, sampling, mask, cap=1.5, level="sequence"), [[1.0, 1.0, 0.0]])
    with pytest.raises(ValueError, match="token' or 'sequence"):
        truncated_is_weights(old, sampling, mask, level="tokens")


# --------------------------------------------------------------------------- aggregation


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


# --------------------------------------------------------------------------- KL coefficient


def test_adaptive_kl_coefficient_by_hand():
    # target 0.5, horizon 100, 10 samples: KL 1.0 -> e = clip(1, -0.2, 0.2) = 0.2 -> 0.1 (1 + 0.02) = 0.102;
    # then KL 0.45 -> e = -0.1 -> 0.102 (1 - 0.01) = 0.10098.
    coef = AdaptiveKLCoef(0.1, target=0.5, horizon=100)
    assert coef.update(1.0, samples=10) == pytest.approx(0.102)
    assert coef.update(0.45, samples=10) == pytest.approx(0.10098)
    restored = AdaptiveKLCoef(0.1, target=0.5, horizon=100)
    restored.load_state_dict(coef.state_dict())
    assert restored.value == coef.value
    assert AdaptiveKLCoef(0.1).update(5.0, samples=10) == 0.1  # target 0: fixed


def test_registries_hold_every_family():
    assert set(ADVANTAGES) == {"grpo", "grpo_batch_std", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline",
                               "remax", "opo", "gdpo", "maxrl", "treerl", "gae"}
    assert set(OBJECTIVES) == {"reinforce", "ppo_clip", "gspo", "cispo", "gmpo", "clip_cov", "kl_cov", "sapo", "dppo_tv",
                               "dppo_kl", "topr"}
    assert set(AGGREGATIONS) == {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"}
    assert ADVANTAGES["grpo"] is grpo
