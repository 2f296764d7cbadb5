"""Supervised guidance in the RL loop: on a task whose reward a random tiny model never earns,
GRPO alone learns nothing (every group is all-wrong), and GRPO with guidance on the failed
problems learns the solution, mixed into the RL step or interleaved every k steps; a resumed
interleaved run continues with the targets it had collected."""

from __future__ import annotations

import json

import torch
from helpers import parameters, reward_curve, tiny_config

from reasonrl import Problem, Task, train

TASK = Task(name="zqz", train=[Problem(id=str(i), prompt=f"say {i}", answer="zqz", metadata={"solution": "zqz"})
                               for i in range(8)],
            test=[Problem(id="t", prompt="say t", answer="zqz")])


def says_zqz(text: str, problem: Problem) -> float:
    return float(text.startswith(problem.answer))


def test_guidance_teaches_what_rl_alone_cannot(tiny_model_dir, tmp_path):
    steps = ["train.steps=40", "train.lr=1e-2"]
    train(tiny_config(tiny_model_dir, tmp_path / "rl", *steps), task=TASK, reward=says_zqz)
    assert max(reward_curve(tmp_path / "rl")) == 0.0  # all-wrong groups: zero advantage, nothing to learn

    train(tiny_config(tiny_model_dir, tmp_path / "mixed", *steps, "guidance.mode=mixed", "guidance.weight=1.0",
                      "guidance.on=all"),
          task=TASK, reward=says_zqz)
    mixed = reward_curve(tmp_path / "mixed")
    assert mixed[0] == 0.0 and sum(mixed[-5:]) / 5 > 0.5, mixed
    lines = [json.loads(line) for line in (tmp_path / "mixed" / "metrics.jsonl").read_text().splitlines()]
    guided = [m for m in lines if "loss/guidance" in m]
    assert guided and guided[-1]["loss/guidance"] < guided[0]["loss/guidance"]

    train(tiny_config(tiny_model_dir, tmp_path / "interleave", *steps, "guidance.mode=interleave",
                      "guidance.every=2", "guidance.on=all"), task=TASK, reward=says_zqz)
    interleaved = reward_curve(tmp_path / "interleave")
    assert sum(interleaved[-5:]) / 5 > 0.5, interleaved


def test_an_interleaved_run_resumes_with_its_collected_targets(tiny_model_dir, tmp_path):
    settings = ["guidance.mode=interleave", "guidance.every=3", "train.lr=1e-2"]
    train(tiny_config(tiny_model_dir, tmp_path / "straight", "train.steps=4", *settings), task=TASK, reward=says_zqz)
    train(tiny_config(tiny_model_dir, tmp_path / "resumed", "train.steps=2", *settings),
          task=TASK, reward=says_zqz)
    train(tiny_config(tiny_model_dir, tmp_path / "resumed", "train.steps=4", "run.resume=true", *settings),
          task=TASK, reward=says_zqz)
    straight, resumed = (parameters(tmp_path / run / "checkpoints" / "step_000004" / "policy")
                         for run in ("straight", "resumed"))
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)
