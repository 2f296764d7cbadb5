"""Methods in a run: a method added by one module and one registry line takes part (the toy of
docs/architecture.md, tests/toy_method.py: its estimation wrapper reaches the learner, its
participant is called and checkpointed), and a run's participants follow the registry's order."""

from __future__ import annotations

import json

import torch
import toy_method
from helpers import TASK, share_of_a, tiny_config

import reasonrl.methods
from reasonrl import train
from reasonrl.trainer import build_run
from reasonrl.training.checkpoint import TRAINER_STATE
from reasonrl.training.runs import start_run


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_method_added_by_one_module_and_one_registry_line_takes_part_in_a_run(tiny_model_dir, tmp_path,
                                                                               monkeypatch):
    monkeypatch.setattr(reasonrl.methods, "METHODS", (*reasonrl.methods.METHODS, toy_method))
    train(tiny_config(tiny_model_dir, tmp_path, "train.steps=2", "run.save_every=2"), task=TASK, reward=share_of_a)
    logged = [m for m in lines(tmp_path / "metrics.jsonl") if "clip/updates" in m]
    assert [m["clip/updates"] for m in logged] == [1.0, 2.0]
    assert any(m["clip/tokens"] > 0 for m in logged), logged  # GRPO's advantages reach past the limit...
    advantages = [record["advantage"] for record in lines(tmp_path / "rollouts.jsonl")]
    assert max(abs(a) for a in advantages) <= toy_method.LIMIT + 1e-6  # ...and the learner trained on them clipped
    state = torch.load(tmp_path / "checkpoints" / "step_000002" / TRAINER_STATE, weights_only=False)
    assert state["clip"] == {"updates": 2}


def test_a_runs_participants_follow_the_registry(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir, tmp_path, "algo.advantage=gae", "guidance.mode=mixed", "guidance.source=replay",
                      "sampling.replay=2", "algo.kl_coef=0.01", "algo.ref_reset_every=2")
    run = build_run(start_run(cfg), TASK, share_of_a)
    parts = run.participants.parts
    # The sampler first; then the methods' in the order of METHODS; then the reports and the guards.
    assert [type(part).__name__ for part in parts] == [
        "ProblemSampler", "CriticUpdate", "GuidanceSteps", "Replay", "KLController", "ReferenceReset",
        "GeneratedTokens", "SyncCheck", "Alarms"]
    assert run.kl is parts[4] and run.estimate.critic is parts[1].critic
    assert list(run.stateful) == ["learner", "sampler", "critic", "guidance", "replay", "kl_coef", "generated_tokens",
                                  "alarms"]
