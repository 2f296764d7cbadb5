"""`reasonrl eval CKPT --config RUN/config.toml` evaluates as the run's in-training evaluation does:
the run's task scored by the run's reward (a reasoning-gym task by the environment's own checker, a
custom reward included), at the run's generation settings, and results.json says which checker it
used. The command line still overrides them."""

from __future__ import annotations

import json

import pytest
from helpers import build_tiny_model

from reasonrl import load_config, train
from reasonrl.commands.cli import main
from reasonrl.commands.eval import checker_scoring, config_scoring
from reasonrl.rewards import score_groups
from reasonrl.types import Completion, Group, Problem

TASK = ["task.name=environment", "task.environment=basic_arithmetic", "task.train_size=8", "task.test_size=6"]


def distinct_share(completion: str, problem: Problem) -> float:
    """A custom reward: distinct characters per character of the completion (above 0 for any text)."""
    return len(set(completion)) / len(completion) if completion else 0.0


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """One training step on a reasoning-gym task with a custom reward, evaluated greedily after it."""
    # Larger initial weights than the shared tiny model, whose greedy completions are special tokens (empty text).
    model_dir = build_tiny_model(tmp_path_factory.mktemp("model"), seed=1, initializer_range=0.2)
    run_dir = tmp_path_factory.mktemp("run")
    cfg = load_config(overrides=[
        f"model.name={model_dir}", f"run.dir={run_dir}", "run.progress=false", "run.tensorboard=false", *TASK,
        "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=12", "train.steps=1",
        "reward.custom=tests.integration.test_eval_config:distinct_share", "reward.custom_weight=0.5",
        "eval.problems=6", "eval.samples=0", "eval.greedy=true", "eval.before=false"])
    result = train(cfg)
    return run_dir, result.eval_after


def test_eval_config_equals_the_in_training_evaluation_of_the_checkpoint(trained_run, tmp_path):
    run_dir, in_training = trained_run
    out = tmp_path / "eval"
    assert main(["eval", str(run_dir / "checkpoints" / "step_000001"), "--config", str(run_dir / "config.toml"),
                 "--temperature", "0", "--n", "1", "--limit", "6", "--out", str(out), "--no-progress"]) == 0
    metrics = json.loads((out / "results.json").read_text())["tasks"]["basic_arithmetic"]
    assert metrics["problems"] == 6
    assert metrics["mean@1"]["value"] == pytest.approx(in_training["eval/greedy_accuracy"])
    assert metrics["reward_mean"] == pytest.approx(in_training["eval/greedy_reward_mean"])
    assert metrics["components"]["custom"] == pytest.approx(in_training["eval/greedy_custom"])
    assert in_training["eval/greedy_custom"] > 0  # the custom reward scored something: the comparison is not 0 = 0
    assert metrics["length_mean"] == pytest.approx(in_training["eval/greedy_len_mean"])  # 12 new tokens at most
    assert metrics["truncated_frac"] == pytest.approx(in_training["eval/greedy_truncated_frac"])
    assert metrics["scored_by"] == {"checker": "the environment basic_arithmetic's own checker, as in training",
                                    "reward_weights": {"correct": 1.0, "format": 0.1, "custom": 0.5}}


def test_the_command_line_overrides_the_configs_generation_settings(trained_run, tmp_path):
    run_dir, _ = trained_run
    out = tmp_path / "eval"
    assert main(["eval", str(run_dir / "checkpoints" / "step_000001"), "--config", str(run_dir / "config.toml"),
                 "--n", "1", "--limit", "2", "--temperature", "1.0", "--out", str(out), "--no-progress"]) == 0
    settings = json.loads((out / "results.json").read_text())["settings"]
    assert (settings["max_new_tokens"], settings["temperature"]) == (12, 1.0)  # the run's rollout.max_new_tokens


def test_a_config_task_is_scored_by_its_environment_and_a_benchmark_by_math_verify():
    cfg = load_config(overrides=TASK)
    problem = Problem(id="p", prompt="Calculate 2 + 3.", answer="5",
                      metadata={"source": "basic_arithmetic",
                                "entry": {"question": "Calculate 2 + 3.", "answer": "5",
                                          "metadata": {"source_dataset": "basic_arithmetic"}}})
    # The environment reads the last line as the answer, math-verify its last number.
    group = Group(problem, (), (Completion((1,), "so it is 5", (0.0,), "stop"),))
    by_environment = score_groups([group], config_scoring(cfg).reward)[0]
    by_math_verify = score_groups([group], checker_scoring().reward)[0]
    assert by_environment.reward_components["correct"][0] < 1.0
    assert by_math_verify.reward_components["correct"] == (1.0,)
