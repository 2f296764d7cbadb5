"""Advantage estimators (reasonrl.algo.advantages) against numbers derived by hand from their
papers' equations: GRPO and its batch-std variant, Dr. GRPO, RLOO, REINFORCE++ (token returns) and
REINFORCE++-baseline, ReMax, OPO, GDPO, MaxRL and GAE, plus the invariances that tie them together."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import F64, close, t

from reasonrl.algo.advantages import (
    ADVANTAGES,
    discounted_returns,
    dr_grpo,
    gae,
    gdpo,
    grpo,
    grpo_batch_std,
    is_token_level,
    lambda_returns,
    maxrl,
    opo,
    reinforce_pp,
    reinforce_pp_baseline,
    remax,
    rloo,
    token_rewards,
)

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


# --------------------------------------------------------------------------- registry


def test_the_registry_names_every_estimator_and_each_name_gives_its_equation():
    assert set(ADVANTAGES) == {"grpo", "grpo_batch_std", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline",
                               "remax", "opo", "gdpo", "maxrl", "treerl", "gae"}
    # Looked up by name, on one group r = [1, 0, 0, 0] (mean 0.25, unbiased std 0.5, see above):
    # GRPO (r - 0.25) / 0.5; Dr. GRPO r - 0.25; RLOO r_i - mean of the others (1, -1/3); MaxRL (r - 0.25) / 0.25.
    rewards = t([[1.0, 0.0, 0.0, 0.0]])
    close(ADVANTAGES["grpo"](rewards, eps=0.0), [[1.5, -0.5, -0.5, -0.5]])
    close(ADVANTAGES["dr_grpo"](rewards), [[0.75, -0.25, -0.25, -0.25]])
    close(ADVANTAGES["rloo"](rewards), [[1.0, -1 / 3, -1 / 3, -1 / 3]])
    close(ADVANTAGES["maxrl"](rewards), [[3.0, -1.0, -1.0, -1.0]])
