"""PRIME end to end on a tiny random model (reasonrl.training.prime): the policy learns the share of
'a' with the implicit PRM's dense rewards beside the outcome's, the PRM learns to rank right answers
above wrong ones from the untrained coin flip, the dense rewards alone (outcome weight 0) teach the
policy and negated unteach it, and a resumed run continues bit for bit."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import TASK, parameters, reward_curve, share_of_a, tiny_config, train_straight_and_resumed

from reasonrl import load_config, train
from reasonrl.config import ConfigError

PRIME = ("prime.enabled=true", "algo.advantage=rloo", "prime.lr=1e-3", "sampling.mask_truncated=false")


def prime_metrics(run_dir, key: str) -> list[float]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [m[key] for m in lines if key in m]


def test_prime_learns_with_its_prm_beside_the_outcome(tiny_model_dir, tmp_path):
    train(tiny_config(tiny_model_dir, tmp_path / "up", "train.steps=30", *PRIME), task=TASK, reward=share_of_a)
    curve = reward_curve(tmp_path / "up")
    assert sum(curve[-5:]) / 5 > sum(curve[:3]) / 3 + 0.3, curve
    accuracy, loss = prime_metrics(tmp_path / "up", "prime/accuracy"), prime_metrics(tmp_path / "up", "prime/loss")
    # The untrained PRM is the reference: every implicit reward is 0, a coin flip, and the CE loss log 2.
    assert accuracy[0] == 0.5 and loss[0] == pytest.approx(math.log(2), abs=1e-6)
    assert all(math.isfinite(r) for r in prime_metrics(tmp_path / "up", "prime/process_reward_mean"))


def has_a_vowel(completion: str, problem) -> float:
    """A 0/1 outcome true for about a third of the tiny model's first samples: labels of both kinds."""
    return float(any(vowel in completion for vowel in "aeiou"))


def test_the_prm_learns_to_rank_right_answers_above_wrong_ones(tiny_model_dir, tmp_path, monkeypatch):
    # On share_of_a the labels turn one-sided as the policy learns, where a PRM of one sign scores every
    # sequence right; on has_a_vowel they stay of both kinds for some 10 steps. Read, per micro-batch
    # of both kinds, how the implicit reward ranks them before the PRM's step (AUC; 0.5 for the
    # untrained PRM, whose rewards are all 0; below 0.5 if the PRM learned the labels backwards).
    from reasonrl.stages.prm import auc
    from reasonrl.training import prime

    judged: list[tuple[list[float], list[int]]] = []
    sign_accuracy = prime.sign_accuracy

    def judging(logits_N: torch.Tensor, labels_N: torch.Tensor) -> torch.Tensor:
        judged.append((logits_N.tolist(), (labels_N > 0.5).int().tolist()))
        return sign_accuracy(logits_N, labels_N)

    monkeypatch.setattr(prime, "sign_accuracy", judging)
    train(tiny_config(tiny_model_dir, tmp_path / "vowel", "train.steps=30", *PRIME), task=TASK, reward=has_a_vowel)
    ranked = [auc(logits, labels) for logits, labels in judged if 0 < sum(labels) < len(labels)]
    print("AUC per micro-batch of both kinds", [round(a, 2) for a in ranked])
    assert len(ranked) >= 12 and ranked[0] == 0.5
    early, late = ranked[:6], ranked[-6:]
    assert sum(late) / len(late) > 0.7 and sum(late) / len(late) > sum(early) / len(early) + 0.15, ranked


@pytest.mark.parametrize("sign", [1, -1])
def test_the_process_rewards_alone_teach_and_a_flipped_sign_unteaches(sign, tiny_model_dir, tmp_path, monkeypatch):
    # With the outcome's weight at 0 the policy sees only the implicit PRM's dense rewards: it learns
    # to write a vowel only if the PRM learned from the labels which tokens earn them and the process
    # return enters the advantage with the right sign. Negated, the same rewards must drive it down.
    from reasonrl.training import prime

    original = prime.implicit_process_rewards
    monkeypatch.setattr(prime, "implicit_process_rewards", lambda *a, **k: sign * original(*a, **k))
    run = tmp_path / f"sign{sign}"
    train(tiny_config(tiny_model_dir, run, "train.steps=30", *PRIME, "prime.outcome_weight=0"),
          task=TASK, reward=has_a_vowel)
    curve = reward_curve(run)
    change = sum(curve[-5:]) / 5 - sum(curve[:3]) / 3
    assert (change > 0.3) if sign == 1 else (change < -0.2), curve


def test_prime_resumes_exactly(tiny_model_dir, tmp_path):
    train_straight_and_resumed(tiny_model_dir, tmp_path, *PRIME, "train.micro_batch_size=5")
    step = "step_000004"
    straight = parameters(tmp_path / "straight" / "checkpoints" / step / "policy")
    resumed = parameters(tmp_path / "resumed" / "checkpoints" / step / "policy")
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    state = {run: torch.load(tmp_path / run / "checkpoints" / step / "trainer_state.pt", weights_only=False,
                             map_location="cpu")["prime"]  # written on the run's device, a GPU where there is one
             for run in ("straight", "resumed")}
    assert state["straight"]["steps"] == state["resumed"]["steps"] == 4
    initial = parameters(tiny_model_dir)
    assert any(not torch.equal(value, initial[name]) for name, value in state["straight"]["model"].items()
               if name in initial)  # the PRM was trained
    for name, value in state["straight"]["model"].items():
        assert torch.equal(value, state["resumed"]["model"][name]), name
    assert reward_curve(tmp_path / "straight") == reward_curve(tmp_path / "resumed")


@pytest.mark.parametrize(("setting", "fix"), [("algo.advantage=grpo", "algo.advantage=rloo"),
                                               ("train.lora_rank=4", "train.lora_rank=0"),
                                               ("run.backend=ray", "run.backend=local"),
                                               ("sampling.mask_truncated=true", "mask_truncated=false")])
def test_prime_refuses_what_it_cannot_combine_with(setting, fix):
    with pytest.raises(ConfigError, match=fix):
        load_config(overrides=["prime.enabled=true", "algo.advantage=rloo", "sampling.mask_truncated=false", setting])

