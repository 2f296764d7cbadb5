"""What a report and `reasonrl inspect --filter wrong` count as a correct rollout: a solution."""

from __future__ import annotations

from reasonrl.report.data import is_correct


def test_a_rollout_is_correct_at_full_credit_only():
    assert is_correct({"components": {"correct": 1.0}, "reward": 1.1})
    assert not is_correct({"components": {"correct": 0.5}, "reward": 0.5})  # reasoning-gym's partial credit
    assert is_correct({"components": {"custom": 0.3}, "reward": 0.3})  # no "correct" component: reward > 0
    assert not is_correct({"components": {"correct": None}, "reward": 1.0})
