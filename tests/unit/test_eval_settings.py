"""`reasonrl eval --config` samples as the config trains (temperature, top_p, top_k, length) and
takes as many of its task's problems as the in-training evaluation (eval.problems); the command
line overrides each; without --config the defaults. The in-training evaluation samples at the
run's top_p and top_k too."""

from __future__ import annotations

import argparse

import pytest

from reasonrl import load_config
from reasonrl.commands.eval import _settings, _tasks, add_eval_parser
from reasonrl.eval import evaluate
from reasonrl.types import Completion, Group, Problem


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_eval_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["eval", "model", *argv])


CFG = load_config(overrides=["rollout.temperature=0.9", "rollout.top_p=0.8", "rollout.top_k=20",
                             "rollout.max_new_tokens=48", "eval.problems=7", "task.test_size=30"])


def test_the_config_s_sampling_is_played_unless_given():
    played = _settings(parse(), CFG)
    assert (played.temperature, played.top_p, played.top_k, played.max_new_tokens) == (0.9, 0.8, 20, 48)
    given = _settings(parse("--top-p", "1.0", "--top-k", "0", "--temperature", "0.5"), CFG)
    assert (given.temperature, given.top_p, given.top_k, given.max_new_tokens) == (0.5, 1.0, 0, 48)
    plain = _settings(parse(), None)
    assert (plain.top_p, plain.top_k) == (1.0, 0)


def test_the_config_s_task_is_limited_to_eval_problems_unless_given():
    assert [len(problems) for problems in _tasks(parse(), CFG).values()] == [7]
    assert [len(problems) for problems in _tasks(parse("--limit", "3"), CFG).values()] == [3]
    assert [len(problems) for problems in _tasks(parse("--limit", "0"), CFG).values()] == [30]


def test_top_k_changes_the_completion_cache_key_and_is_refused_for_beam_search():
    settings = _settings(parse(), None)
    assert settings.sampling_key("m") != _settings(parse("--top-k", "5"), None).sampling_key("m")
    with pytest.raises(ValueError, match="top-k"):
        _settings(parse("--top-k", "5", "--tts", "beam", "--budget", "1,2"), None)


class RecordingEngine:
    """Answers every problem with "5" and keeps the sampling parameters it was asked for."""

    def __init__(self):
        self.asked = []

    def generate(self, problems, sampling):
        self.asked.append(sampling)
        return [Group(problem=p, prompt_ids=(0,), completions=tuple(
            Completion(token_ids=(1,), text="5", logprobs=(0.0,), finish_reason="stop") for _ in range(sampling.n)))
            for p in problems]


def test_the_in_training_evaluation_samples_at_the_given_top_p_and_top_k():
    from reasonrl.rewards import MathReward, WeightedReward

    engine = RecordingEngine()
    metrics = evaluate(engine, [Problem(id="a", prompt="2+3", answer="5")], WeightedReward({"correct": (MathReward(), 1.0)}),
             temperature=0.7, top_p=0.9, top_k=8, samples=2, greedy=True, max_new_tokens=4, progress=False)
    greedy, sampled = engine.asked
    assert (greedy.temperature, greedy.top_p, greedy.top_k) == (0.0, 1.0, 0)
    assert (sampled.temperature, sampled.top_p, sampled.top_k, sampled.n) == (0.7, 0.9, 8, 2)
    assert metrics["eval/sampled_accuracy"] == 1.0 and metrics["eval/greedy_timeouts"] == 0.0
