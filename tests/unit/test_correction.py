"""Off-policy corrections by hand: truncated importance weights per token and per sequence, masked
importance sampling at its three levels, IcePop as a composition of a token mask and token
weights, the statistics, and that masked tokens leave the loss and its normaliser in the learner
(a masked token left in the denominator would shrink the gradient of every kept one by the kept
share)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from helpers import close, group, t, tiny_policy

from reasonrl.algo.aggregation import seq_mean_token_mean, token_mean
from reasonrl.algo.correction import rejection_mask, rejection_stats, truncated_is_weights
from reasonrl.algo.objectives import ppo_clip
from reasonrl.training.learner import Learner, OptimConfig, PolicyLoss, make_train_batch

# Learner - sampler log-ratios per token: row 0 [0.5, -0.5] (ratios 1.648721, 0.606531; product 1,
# geometric mean 1), row 1 [0.5, 0.5] (product e = 2.718282, geometric mean 1.648721), row 2 [0.1]
# and padding. The padding's own "ratio" (old 0 vs sampling 3) must never count.
OLD = t([[-1.0, -1.0, 0.0], [-1.0, -1.0, 0.0], [-1.0, 0.0, 0.0]])
SAMPLING = t([[-1.5, -0.5, 3.0], [-1.5, -1.5, 3.0], [-1.1, 3.0, 3.0]])
MASK = t([[1, 1, 0], [1, 1, 0], [1, 0, 0]])


def test_token_mask_keeps_the_tokens_inside_the_band():
    # band [0.7, 1.5]: 1.6487 and 0.6065 out, e^0.1 = 1.105 in.
    keep = rejection_mask(OLD, SAMPLING, MASK, level="token", low=0.7, high=1.5)
    torch.testing.assert_close(keep, t([[0, 0, 0], [0, 0, 0], [1, 0, 0]]))
    assert rejection_mask(OLD, SAMPLING, MASK, level="token", low=0.5, high=2.0).equal(MASK)


def test_sequence_mask_uses_the_product_and_geometric_the_mean():
    # band [0.5, 2]: products 1 (kept), e (dropped), 1.105 (kept);
    # geometric means 1, 1.6487, 1.105: all kept; with high 1.5 row 1 is dropped too.
    torch.testing.assert_close(rejection_mask(OLD, SAMPLING, MASK, level="sequence", low=0.5, high=2.0),
                               t([[1, 1, 0], [0, 0, 0], [1, 0, 0]]))
    assert rejection_mask(OLD, SAMPLING, MASK, level="geometric", low=0.5, high=2.0).equal(MASK)
    torch.testing.assert_close(rejection_mask(OLD, SAMPLING, MASK, level="geometric", low=0.5, high=1.5),
                               t([[1, 1, 0], [0, 0, 0], [1, 0, 0]]))


def test_a_band_that_excludes_one_or_an_unknown_level_is_refused():
    with pytest.raises(ValueError, match="must contain 1"):
        rejection_mask(OLD, SAMPLING, MASK, low=1.2, high=2.0)
    with pytest.raises(ValueError, match="token, sequence, geometric"):
        rejection_mask(OLD, SAMPLING, MASK, level="tokens")


def test_icepop_is_a_token_mask_with_token_weights():
    # IcePop's M(k) = k for k in [alpha, beta], else 0; alpha 0.5, beta 5 here, and one token far out.
    old, sampling, mask = t([[-1.0, -1.0, -1.0]]), t([[-1.5, -0.5, -3.0]]), t([[1, 1, 1]])
    icepop = rejection_mask(old, sampling, mask, level="token", low=0.5, high=5.0) * \
        truncated_is_weights(old, sampling, mask, cap=5.0)
    k = [math.exp(0.5), math.exp(-0.5), math.exp(2.0)]  # 1.6487, 0.6065, 7.389 (> beta: masked)
    torch.testing.assert_close(icepop, t([[k[0], k[1], 0.0]]))


def test_statistics_count_tokens_and_whole_sequences():
    keep = rejection_mask(OLD, SAMPLING, MASK, level="sequence", low=0.5, high=2.0)
    stats = rejection_stats(OLD, SAMPLING, MASK, keep)
    # 5 tokens, 2 masked (row 1); 3 sequences, 1 masked; ratios sorted [0.6065, 1.105, 1.6487 x 3].
    assert stats["rollout/masked_token_frac"] == pytest.approx(0.4)
    assert stats["rollout/masked_seq_frac"] == pytest.approx(1 / 3)
    assert stats["rollout/is_ratio_p50"] == pytest.approx(math.exp(0.5))
    assert stats["rollout/is_ratio_max"] == pytest.approx(math.exp(0.5))
    # torch.quantile interpolates: the 5% point lies 0.2 of the way from the 1st to the 2nd value.
    assert stats["rollout/is_ratio_p05"] == pytest.approx(math.exp(-0.5) + 0.2 * (math.exp(0.1) - math.exp(-0.5)))


def learner_gradients(batch, loss):
    model = tiny_policy()
    learner = Learner(model, OptimConfig(lr=0.0, grad_clip=0.0))
    metrics = learner.update(batch, loss, micro_batch_size=2)
    return {name: p.grad.clone() for name, p in model.named_parameters()}, metrics


def mismatched_batch():
    """Four sequences of 4 completion tokens; the sampler's log-probs are the learner's, except
    that token 1 of sequence 0 and all of sequence 2 are 1 nat off (ratio e: masked by [0.5, 2])."""
    generator = torch.Generator().manual_seed(3)
    groups = [group([1, 2, 3], *[torch.randint(1, 32, (4,), generator=generator).tolist() for _ in range(4)])]
    batch = make_train_batch(groups, [1.0, -0.5, 0.25, 2.0], pad_id=0)
    learner_logp = Learner(tiny_policy(), OptimConfig(lr=0.0)).logprobs(tiny_policy(), batch, micro_batch_size=2)
    off_NT = torch.zeros_like(batch.loss_mask_NT)
    completion = batch.loss_mask_NT.bool()
    first = completion[0].nonzero().flatten()
    off_NT[0, first[1]] = 1.0
    off_NT[2] = completion[2].float()
    return replace(batch, sampling_logp_NT=(learner_logp - off_NT) * batch.loss_mask_NT), off_NT


@pytest.mark.parametrize(("aggregation", "level"), [(token_mean, "token"), (seq_mean_token_mean, "token"),
                                                    (seq_mean_token_mean, "sequence")])
def test_masked_tokens_leave_the_loss_and_its_normaliser(aggregation, level):
    batch, off_NT = mismatched_batch()
    masked, metrics = learner_gradients(batch, PolicyLoss(objective=ppo_clip, aggregation=aggregation,
                                                          mis_level=level, mis_low=0.5, mis_high=2.0))
    # The same update on a batch whose mask leaves those tokens out by hand (and, at the sequence
    # level, all of sequence 0, whose product of ratios is e too), with the same sampler log-probs.
    dropped_NT = off_NT.clone()
    if level == "sequence":
        dropped_NT[0] = batch.loss_mask_NT[0]
    kept_mask = batch.loss_mask_NT * (1 - dropped_NT)
    by_hand = replace(batch, loss_mask_NT=kept_mask, advantages_NT=batch.advantages_NT * (1 - dropped_NT))
    expected, _ = learner_gradients(by_hand, PolicyLoss(objective=ppo_clip, aggregation=aggregation))
    for name in expected:
        torch.testing.assert_close(masked[name], expected[name], atol=1e-7, rtol=1e-5, msg=name)
    # Had the masked tokens stayed in the token_mean denominator, every gradient would be smaller
    # by the kept share: a difference far above the tolerance.
    if aggregation is token_mean:
        share = float(kept_mask.sum() / batch.loss_mask_NT.sum())
        name = next(iter(expected))
        assert not torch.allclose(masked[name], expected[name] * share, atol=1e-7, rtol=1e-5)
    tokens = float(batch.loss_mask_NT.sum())
    assert metrics["rollout/masked_token_frac"] == pytest.approx(float(dropped_NT.sum()) / tokens)
    assert metrics["rollout/masked_seq_frac"] == pytest.approx(0.25 if level == "token" else 0.5)


def test_masking_nothing_changes_nothing():
    batch, _ = mismatched_batch()
    wide = PolicyLoss(objective=ppo_clip, aggregation=token_mean, mis_level="token", mis_low=0.0, mis_high=10.0)
    masked, metrics = learner_gradients(batch, wide)
    plain, _ = learner_gradients(batch, PolicyLoss(objective=ppo_clip, aggregation=token_mean))
    assert metrics["rollout/masked_token_frac"] == 0.0
    for name in plain:
        torch.testing.assert_close(masked[name], plain[name], atol=1e-7, rtol=1e-5, msg=name)


def test_truncated_is_weights_token_and_sequence():
    # learner - sampler log-ratios [0.5, -0.5]: token weights [e^0.5 = 1.648721 -> cap 1.5, e^-0.5 = 0.606531];
    # sequence: the log-ratios sum to 0 -> weight 1 on both tokens; padding gets 0.
    old, sampling, mask = t([[-1.0, -1.0, 0.0]]), t([[-1.5, -0.5, 3.0]]), t([[1, 1, 0]])
    close(truncated_is_weights(old, sampling, mask, cap=1.5), [[1.5, 0.6065307, 0.0]])
    close(truncated_is_weights(old, sampling, mask, cap=1.5, level="sequence"), [[1.0, 1.0, 0.0]])
    with pytest.raises(ValueError, match="token' or 'sequence"):
        truncated_is_weights(old, sampling, mask, level="tokens")
