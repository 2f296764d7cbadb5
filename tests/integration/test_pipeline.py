"""Staged pipelines and rejection-sampling fine-tuning on a tiny model: stages chain their policies,
finished stages are skipped, an interrupted stage resumes exactly; RFT keeps only verified samples
and raises the pass rate."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import parameters, sft_config

from reasonrl import Problem, Task
from reasonrl.config import ConfigError
from reasonrl.stages.pipeline import load_pipeline, run_pipeline
from reasonrl.stages.rft import accepted, train_rft
from reasonrl.trainer import train
from reasonrl.types import Completion, Group


def write_pipeline(tmp_path: Path, model_dir: Path, root: Path) -> Path:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i} + 1", "answer": str(i + 1),
                                        "solution": f"\\boxed{{{i + 1}}}"}) + "\n" for i in range(8)))
    common = [f"model.name={model_dir}", "run.progress=false", "run.tensorboard=false", "train.dtype=float32",
              "rollout.dtype=float32", "task.name=jsonl", f"task.train_path={data}", "task.test_size=2",
              "eval.problems=0", "train.lr=1e-3", "run.save_every=1"]
    path = tmp_path / "pipeline.toml"
    path.write_text(f'dir = "{root}"\noverrides = {json.dumps(common)}\n\n'
                    '[[stage]]\nname = "cold-start"\nkind = "sft"\n'
                    'overrides = ["task.answer_field=solution", "train.steps=2", "sft.batch_size=4"]\n\n'
                    '[[stage]]\nname = "grpo"\nkind = "rl"\n'
                    'overrides = ["train.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=4", '
                    '"rollout.max_new_tokens=8", "reward.fn=helpers:share_of_a", "sampling.mask_truncated=false"]\n')
    return path


def test_stages_chain_skip_when_done_and_resume_exactly(tiny_model_dir, tmp_path):
    (tmp_path / "a").mkdir()
    straight = write_pipeline(tmp_path / "a", tiny_model_dir, tmp_path / "a" / "runs")
    stages = load_pipeline(straight)
    assert [s.kind for s in stages] == ["sft", "rl"]
    assert stages[1].config.model.name == str(tmp_path / "a" / "runs" / "cold-start" / "checkpoints" / "step_000002"
                                              / "policy")
    run_pipeline(straight, log=lambda line: None)
    messages: list[str] = []
    run_pipeline(straight, log=messages.append)
    assert messages == ["stage cold-start (sft): done, skipped", "stage grpo (rl): done, skipped"]

    # The same pipeline interrupted after the RL stage's first step, then run again: it resumes.
    (tmp_path / "b").mkdir()
    interrupted = write_pipeline(tmp_path / "b", tiny_model_dir, tmp_path / "b" / "runs")

    def one_step_only(cfg):
        return train(replace(cfg, train=replace(cfg.train, steps=1)))

    from reasonrl.stages.pipeline import _runners

    run_pipeline(interrupted, runners={**_runners(), "rl": one_step_only}, log=lambda line: None)
    messages.clear()
    run_pipeline(interrupted, log=messages.append)
    assert messages[1].startswith("stage grpo (rl): resuming")
    final = "runs/grpo/checkpoints/step_000002/policy"
    a, b = parameters(tmp_path / "a" / final), parameters(tmp_path / "b" / final)
    assert all((a[name] == b[name]).all() for name in a)
    # and the RL stage did train (a reward with spread, cut-off completions kept in the loss): its
    # weights are not the cold start's it began from
    cold = parameters(tmp_path / "a" / "runs/cold-start/checkpoints/step_000002/policy")
    assert any(not (a[name] == cold[name]).all() for name in a)


def test_bad_pipelines_are_named(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[[stage]]\nname = "x"\nkind = "magic"\n')
    with pytest.raises(ConfigError, match="kind 'magic'; allowed: sft, rl, dpo, rft"):
        load_pipeline(path)
    path.write_text('dir = "runs"\n')
    with pytest.raises(ConfigError, match="no \\[\\[stage\\]\\] tables"):
        load_pipeline(path)


def test_accepted_keeps_distinct_verified_completions():
    def completion(ids):
        return Completion(token_ids=ids, text="t", logprobs=(0.0,) * len(ids), finish_reason="stop")

    group = Group(problem=Problem(id="p", prompt="x", answer="a"), prompt_ids=(0,),
                  completions=(completion((1,)), completion((2,)), completion((1,)), completion((3,))),
                  rewards=(1.1, 0.1, 1.1, 1.0), reward_components={"correct": (1.0, 0.0, 1.0, 1.0)})
    kept = accepted([group])
    assert [g.completions[0].token_ids for g in kept] == [(1,), (3,)]  # (2,) is wrong, the second (1,) a repeat
    partial = replace(group, reward_components={"correct": (0.5, 0.0, 1.0, 0.25)})  # partial credit is not verified
    assert [g.completions[0].token_ids for g in accepted([partial])] == [(1,)]


def contains_a(completion: str, problem: Problem) -> float:
    """Solved when an 'a' appears: about 7% of the tiny model's 8-token completions, so that round 0
    keeps a few of its 64 samples (the 25% share of `mostly_a` leaves most rounds with none)."""
    return float("a" in completion)


def test_rft_raises_the_pass_rate(tiny_model_dir, tmp_path):
    task = Task(name="letters", train=[Problem(id=str(i), prompt=f"say {i}", answer="a") for i in range(8)],
                test=[Problem(id="t", prompt="say t", answer="a")])
    train_rft(sft_config(tiny_model_dir, tmp_path / "run", "train.steps=6", "rft.problems_per_round=8",
                         "rft.steps_per_round=4", "rollout.group_size=8", "rollout.max_new_tokens=8",
                         "rollout.temperature=1.0", "rollout.dtype=float32", "train.lr=1e-2"),
              task=task, reward=contains_a)
    rounds = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rounds[-1]["reward/mean"] > rounds[0]["reward/mean"] + 0.3, rounds
    assert all(r["rft/kept"] <= 8 * 8 for r in rounds)


def test_ctrl_c_in_a_stage_says_to_run_the_pipeline_again(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from reasonrl.commands.cli import main
    from reasonrl.stages import pipeline
    from reasonrl.training.skeleton import RunInterrupted

    path = write_pipeline(tmp_path, tiny_model_dir, tmp_path / "runs")

    def interrupted(cfg):
        raise RunInterrupted("interrupted at step 1 of 2; its last checkpoint is X",
                             f"reasonrl sft {cfg.run.dir}/config.toml run.resume=true")

    monkeypatch.setattr(pipeline, "_runners", lambda: {"sft": interrupted})
    assert main(["pipeline", str(path)]) == 130
    err = capsys.readouterr().err.strip()
    assert err == (f"reasonrl: stage cold-start (sft) interrupted at step 1 of 2; its last checkpoint is X; "
                   f"resume with `reasonrl pipeline {path}`")


def test_a_stage_whose_model_cannot_be_found_is_one_line(tmp_path, capsys):
    from reasonrl.commands.cli import main

    not_a_model = tmp_path / "weights.bin"
    not_a_model.write_bytes(b"x")
    path = write_pipeline(tmp_path, not_a_model, tmp_path / "runs")
    assert main(["pipeline", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"reasonrl: model.name='{not_a_model}' is a file")
