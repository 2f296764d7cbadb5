"""The run skeleton every training command shares (reasonrl.training.skeleton), around a stage whose
step only counts: checkpoints when due and at the end, a spent budget stops the run with a
checkpoint that resumes to the end, the final checkpoint, and the budget `train` alone has."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from reasonrl import load_config
from reasonrl.config import ConfigError
from reasonrl.models import load_model, load_tokenizer
from reasonrl.training.checkpoint import checkpoints, load_trainer_state
from reasonrl.training.skeleton import PolicyCheckpoints, RunLoop, show_metrics, start_stage


class Counter:
    """The stage's only state: how many steps it has taken."""

    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.value = state["value"]


def count_stage(cfg, *, spend_at: int = 0, wait_s: float = 0.0) -> Path:
    """A stage whose step adds 1 to its counter; it spends a budget of its own after step `spend_at`
    (0: never) and waits `wait_s` before its first step."""
    start = start_stage(cfg)
    tokenizer = load_tokenizer(cfg.model.name)
    model = load_model(cfg.model.name, dtype=torch.float32, device=start.device)
    counter = Counter()
    stateful = {"counter": counter}
    loop = RunLoop.open(start, stateful, save=PolicyCheckpoints(start, stateful, model=model, tokenizer=tokenizer),
                        desc="count", show=show_metrics(value=("count/value", ".0f")))
    time.sleep(wait_s)
    while loop.running():
        counter.value += 1
        loop.record({"count/value": float(counter.value)})
        loop.save_if_due(spent="count.budget=2 reached" if loop.step == spend_at else "")
    loop.close()
    return loop.final_checkpoint()


def config(model_dir: Path, run_dir: Path, *extra: str):
    return load_config(overrides=[f"model.name={model_dir}", f"run.dir={run_dir}", "run.progress=false",
                                  "run.tensorboard=false", "run.save_every=0", "run.keep_checkpoints=10", *extra])


def logged(run_dir: Path) -> list[tuple[int, float]]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(line["step"], line["count/value"]) for line in lines]


def saved_counts(run_dir: Path) -> dict[str, int]:
    return {c.name: load_trainer_state(c)["counter"]["value"] for c in checkpoints(run_dir)}


def test_checkpoints_every_save_every_steps_and_after_the_last(tiny_model_dir, tmp_path):
    final = count_stage(config(tiny_model_dir, tmp_path / "run", "train.steps=5", "run.save_every=2"))
    assert final == tmp_path / "run" / "checkpoints" / "step_000005"
    assert saved_counts(tmp_path / "run") == {"step_000002": 2, "step_000004": 4, "step_000005": 5}
    assert logged(tmp_path / "run") == [(step, float(step)) for step in range(1, 6)]
    assert (final / "policy" / "config.json").is_file()  # the policy, loadable as a model


def test_a_spent_time_budget_stops_with_a_checkpoint_that_resumes_to_the_end(tiny_model_dir, tmp_path, capsys):
    # A budget far below one step's time, and run.save_every=0 (the final checkpoint only): the run
    # stops after its first step, checkpointed.
    stopped = count_stage(config(tiny_model_dir, tmp_path / "run", "train.steps=4", "train.max_minutes=1e-9"))
    assert stopped.name == "step_000001"
    assert saved_counts(tmp_path / "run") == {"step_000001": 1}
    assert "train.max_minutes=1e-09 reached after step 1: stopping here" in capsys.readouterr().out
    finished = count_stage(config(tiny_model_dir, tmp_path / "run", "train.steps=4", "run.resume=true"))
    assert finished.name == "step_000004"
    assert saved_counts(tmp_path / "run") == {"step_000001": 1, "step_000004": 4}  # the count went on from 1
    assert logged(tmp_path / "run") == [(step, float(step)) for step in range(1, 5)]


def test_a_budget_the_command_names_stops_the_run_the_same_way(tiny_model_dir, tmp_path, capsys):
    stopped = count_stage(config(tiny_model_dir, tmp_path / "run", "train.steps=5"), spend_at=2)
    assert stopped.name == "step_000002"
    assert logged(tmp_path / "run") == [(1, 1.0), (2, 2.0)]
    assert "count.budget=2 reached after step 2: stopping here" in capsys.readouterr().out


def test_the_time_budget_starts_with_the_first_step(tiny_model_dir, tmp_path, capsys):
    # What a command does between opening the run and its first step (train's evaluation) is not
    # charged to train.max_minutes: a 0.6 s budget outlasts a 1 s wait before two quick steps.
    final = count_stage(config(tiny_model_dir, tmp_path / "run", "train.steps=2", "train.max_minutes=0.01"),
                        wait_s=1.0)
    assert final.name == "step_000002"
    assert [c.name for c in checkpoints(tmp_path / "run")] == ["step_000002"]
    assert "stopping here" not in capsys.readouterr().out


def test_the_final_checkpoint_is_the_last_one_written_or_resumed_from(tiny_model_dir, tmp_path):
    done = count_stage(config(tiny_model_dir, tmp_path / "run", "train.steps=2"))
    again = count_stage(config(tiny_model_dir, tmp_path / "run", "train.steps=2", "run.resume=true"))
    assert again == done  # nothing left to train: the checkpoint resumed from
    with pytest.raises(ValueError, match="train.steps=0: nothing was trained"):
        count_stage(config(tiny_model_dir, tmp_path / "none", "train.steps=0"))


def test_a_stage_refuses_the_token_budget_before_claiming_its_run_dir(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="train.max_generated_tokens is a budget of `reasonrl train`"):
        count_stage(config(tiny_model_dir, tmp_path / "run", "train.max_generated_tokens=100"))
    assert not (tmp_path / "run").exists()
