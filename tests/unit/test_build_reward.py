"""From reward.* knobs to the composed reward: which components, weights, gates and verifiers."""

from __future__ import annotations

import pytest

from reasonrl import load_config
from reasonrl.build import build_weighted_reward
from reasonrl.rewards import CosineLengthReward, MajorityVoteReward, RewardError, RoutedReward
from reasonrl.types import Completion, Problem

PROBLEM = Problem(id="p", prompt="1+1?", answer="2")
MIXED = Problem(id="q", prompt="same?", answer="2", metadata={"verifier": "majority_vote"})


def completion(text: str, tokens: int, finish: str = "stop") -> Completion:
    return Completion(token_ids=tuple(range(tokens)), text=text, logprobs=(-0.5,) * tokens, finish_reason=finish)


def reward(*overrides: str):
    return build_weighted_reward(load_config(overrides=list(overrides)))


def test_defaults_are_gated_correctness_and_format():
    scores = reward().score_group(PROBLEM, [completion("\\boxed{2}", 5), completion("\\boxed{3}", 5)])
    assert scores.components == {"correct": (1.0, 0.0), "format": (1.0, 0.0)}
    assert scores.totals == pytest.approx((1.1, 0.0))


def test_shaping_components_use_token_lengths():
    built = reward("rollout.max_new_tokens=10", "reward.overlong_buffer=4", "reward.repetition_ngram=2",
                   "reward.repetition_weight=0.5", "reward.format_weight=0")
    tokens = Completion(token_ids=(1, 2, 1, 2, 1, 2, 3, 4, 5), text="2", logprobs=(0.0,) * 9, finish_reason="stop")
    scores = built.score_group(PROBLEM, [tokens])
    # overlong: 9 tokens, L_max 10, L_cache 4: (6 - 9) / 4 = -0.75
    # repetition: bigrams 12 21 12 21 12 23 34 45: 5 distinct of 8, penalty -(1 - 5/8) = -0.375
    assert scores.components["overlong"] == pytest.approx((-0.75,))
    assert scores.components["repetition"] == pytest.approx((-0.375,))
    assert scores.totals == pytest.approx((1.0 - 0.75 - 0.5 * 0.375,))


def test_cosine_length_replaces_the_verifier_term_and_keeps_it_logged():
    built = reward("rollout.max_new_tokens=10", "reward.cosine_length=true", "reward.format_weight=0")
    scores = built.score_group(PROBLEM, [completion("2", 5), completion("3", 5), completion("2", 10, "length")])
    # correct at half length: 1 + 0.5 * (2 - 1) * (1 + cos(pi/2)) = 1.5; wrong: 0 + 0.5 * -10 * 1 = -5; cut off: -10
    assert scores.components["cosine"] == pytest.approx((1.5, -5.0, -10.0))
    assert scores.components["correct"] == (1.0, 0.0, 1.0)
    assert scores.totals == pytest.approx((1.5, -5.0, -10.0))
    with pytest.raises(ValueError, match="cosine_length needs a verifier that checks one answer"):
        reward("reward.cosine_length=true", "reward.verifier=majority_vote")


def test_majority_vote_trains_on_agreement_and_logs_accuracy():
    built = reward("reward.verifier=majority_vote", "reward.format_weight=0")
    scores = built.score_group(PROBLEM, [completion("3", 1), completion("3", 1), completion("2", 1)])
    assert scores.components == {"majority": (1.0, 1.0, 0.0), "correct": (0.0, 0.0, 1.0)}
    assert scores.totals == (1.0, 1.0, 0.0)


def test_routed_verifier_follows_the_problem():
    built = reward("reward.verifier=routed", "reward.format_weight=0")
    group = [completion("3", 1), completion("3", 1), completion("2", 1)]
    assert built.score_group(PROBLEM, group).components["correct"] == (0.0, 0.0, 1.0)
    assert built.score_group(MIXED, group).components["correct"] == (1.0, 1.0, 0.0)
    unknown = Problem(id="u", prompt="?", answer="2", metadata={"verifier": "oracle"})
    with pytest.raises(RewardError, match="names verifier 'oracle'"):
        built.score_group(unknown, group)


def test_sequence_logprob_confidence_needs_no_model():
    built = reward("reward.confidence=sequence_logprob", "reward.confidence_weight=0.1", "reward.format_weight=0")
    assert built.score_group(PROBLEM, [completion("2", 4)]).totals == pytest.approx((1.0 - 0.05,))
    with pytest.raises(ValueError, match="runs the policy"):
        reward("reward.confidence=self_certainty")


def test_all_zero_weights_are_refused():
    with pytest.raises(ValueError, match="every reward weight is 0"):
        reward("reward.correct_weight=0", "reward.format_weight=0")


def test_verifier_types():
    assert isinstance(build_weighted_reward(load_config(overrides=["reward.verifier=routed"]))._components["correct"][0],
                      RoutedReward)
    assert isinstance(reward("reward.verifier=majority_vote")._components["majority"][0], MajorityVoteReward)
    assert isinstance(reward("reward.cosine_length=true")._components["cosine"][0], CosineLengthReward)


def test_math_workers_check_in_a_process_pool(monkeypatch):
    import reasonrl.rewards.math as math_module
    from reasonrl.rewards import PooledMathReward
    from reasonrl.rewards.components import build_verifier

    cfg = load_config(overrides=["reward.math_workers=1", "reward.math_timeout_s=2"])
    reward = build_weighted_reward(cfg)
    assert isinstance(build_verifier(cfg), PooledMathReward)
    assert isinstance(reward._components["correct"][0], PooledMathReward)
    pooled_calls = []
    check_many = math_module.check_many
    monkeypatch.setattr(math_module, "check_many",
                        lambda pairs, **kwargs: (pooled_calls.append(kwargs), check_many(pairs, **kwargs))[1])
    completions = [Completion(token_ids=(1,), text=t, logprobs=(0.0,), finish_reason="stop")
                   for t in ("\\boxed{\\frac{1}{2}}", "\\boxed{0.25}")]
    scores = reward.score_group(Problem(id="p", prompt="half?", answer="0.5"), completions)
    assert scores.components["correct"] == (1.0, 0.0)
    assert pooled_calls == [{"workers": 1, "timeout_s": 2.0}]  # one call for the group, in the configured pool
