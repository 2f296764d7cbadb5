"""One way to make a function the reward: reward.fn (a module or a file) from the CLI and
train(cfg, reward=fn) from Python build the same reward, alone; reward.custom adds one beside the
configured components; the user's code is imported when the config loads, so its errors are config
errors; the CLI's jsonl task and Task.from_records give the same prompts."""

from __future__ import annotations

import json
import sys

import pytest

from reasonrl import load_config
from reasonrl.build import build_task, build_weighted_reward, check_user_reward
from reasonrl.config import ConfigError
from reasonrl.registry import import_object
from reasonrl.tasks import Task
from reasonrl.types import Completion, Problem

PROBLEM = Problem(id="p", prompt="1+1?", answer="2")
REWARD_FILE = '''
def says_two(completion, problem):
    return 0.25 if "2" in completion else -1.0
'''


def completion(text: str) -> Completion:
    return Completion(token_ids=(1, 2), text=text, logprobs=(-0.5, -0.5), finish_reason="stop")


@pytest.fixture
def reward_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_reward.py").write_text(REWARD_FILE)
    return tmp_path / "my_reward.py"


def test_a_file_path_imports_relative_to_the_working_directory_and_absolute(reward_file):
    relative = import_object("my_reward.py:says_two")
    assert relative("x = 2", PROBLEM) == 0.25
    assert import_object(f"{reward_file}:says_two") is relative  # one module per file
    assert relative.__module__ in sys.modules  # registered, so it pickles by reference


@pytest.mark.parametrize(("spec", "message"), [
    ("missing.py:fn", "no file .*missing.py .*working directory"),
    ("my_reward.py:nope", "has no attribute 'nope'"),
    ("no_such_module_xyz:fn", "cannot import module 'no_such_module_xyz'.*PYTHONPATH"),
    ("broken.py:fn", "raised SyntaxError"),
    ("raising.py:fn", "raised RuntimeError: at import"),
])
def test_import_failures_name_the_spec(reward_file, spec, message):
    (reward_file.parent / "broken.py").write_text("def fn(:\n")
    (reward_file.parent / "raising.py").write_text("raise RuntimeError('at import')\n")
    with pytest.raises(ValueError, match=message):
        import_object(spec)


def test_reward_fn_is_the_whole_reward_as_in_python(reward_file):
    from_cli = build_weighted_reward(load_config(overrides=["reward.fn=my_reward.py:says_two"]))
    from_python = build_weighted_reward(load_config(), import_object("my_reward.py:says_two"))
    completions = [completion("\\boxed{2}"), completion("\\boxed{3}")]
    assert from_cli.weights == from_python.weights == {"reward": 1.0}  # no math-verify, no format reward
    assert from_cli.score_group(PROBLEM, completions) == from_python.score_group(PROBLEM, completions)
    assert from_cli.score_group(PROBLEM, completions).totals == (0.25, -1.0)


def test_reward_custom_adds_beside_the_configured_components(reward_file):
    built = build_weighted_reward(load_config(overrides=["reward.custom=my_reward.py:says_two",
                                                         "reward.custom_weight=2"]))
    assert built.weights == {"correct": 1.0, "format": 0.1, "custom": 2.0}
    # correct 1 + gated format 0.1 + 2 * 0.25; wrong: 0 + 0 + 2 * -1
    assert built.score_group(PROBLEM, [completion("\\boxed{2}"), completion("\\boxed{3}")]).totals == \
        pytest.approx((1.6, -2.0))


@pytest.mark.parametrize("key", ["reward.fn", "reward.custom", "reward.verifier"])
def test_a_bad_reward_is_a_config_error_before_anything_loads(reward_file, key):
    # model.name names nothing: the reward's error comes first, from load_config alone.
    with pytest.raises(ConfigError, match=f"{key}: .*no file"):
        load_config(overrides=[f"{key}=missing.py:fn", "model.name=/nowhere/model"])
    (reward_file.parent / "values.py").write_text("NUMBER = 3\n")
    with pytest.raises(ConfigError, match="is a int: expected a function"):
        load_config(overrides=[f"{key}=values.py:NUMBER"])


def test_knobs_a_whole_reward_leaves_without_effect_are_refused(reward_file):
    with pytest.raises(ConfigError, match="reward.format_weight=0.5 has no effect: .*reward.fn is not set"):
        load_config(overrides=["reward.fn=my_reward.py:says_two", "reward.format_weight=0.5"])
    with pytest.raises(ConfigError, match="reward.overlong_buffer=4: no effect, since the reward given to train"):
        check_user_reward(load_config(overrides=["reward.overlong_buffer=4"]), import_object("my_reward.py:says_two"))
    with pytest.raises(ConfigError, match="the reward is given twice"):
        check_user_reward(load_config(overrides=["reward.fn=my_reward.py:says_two"]), lambda text, problem: 0.0)
    check_user_reward(load_config(overrides=["reward.overlong_buffer=4"]), None)  # no reward given: nothing to refuse


def test_the_cli_and_from_records_give_the_same_prompts(tmp_path):
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1), "source_id": i} for i in range(4)]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    from_cli = build_task(load_config(overrides=["task.name=jsonl", f"task.train_path={path}",
                                                             "task.test_size=1"]))
    from_python = Task.from_records(str(path), test_size=1)
    assert [p.prompt for p in from_cli.train] == [p.prompt for p in from_python.train]
    assert from_python.train[0].prompt == "What is 0 + 1?\nPut the final answer in \\boxed{}."
    assert from_python.train[0].metadata == {"source_id": 0}  # extra fields travel in the metadata


def test_the_readme_example_reward_is_a_reward_fn_from_the_command_line():
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "own_data_and_reward.py"
    built = build_weighted_reward(load_config(overrides=[f"reward.fn={example}:exact_answer"]))
    scores = built.score_group(PROBLEM, [completion("so \\boxed{2}."), completion("\\boxed{3}"), completion("2")])
    assert scores.totals == (1.0, 0.0, 0.0)


def test_what_happens_to_a_raising_reward_applies_to_ones_own(reward_file):
    from reasonrl.rewards.compose import RewardError, score_groups
    from reasonrl.types import Group

    reward_file.write_text(REWARD_FILE + "\n\ndef fails_on_three(completion, problem):\n"
                           "    if '3' in completion:\n        raise ValueError('a bug in the reward')\n    return 1.0\n")
    # reward.on_error is not among the knobs a reward given in Python makes pointless
    check_user_reward(load_config(overrides=["reward.on_error=skip_group"]), import_object("my_reward.py:says_two"))
    cfg = load_config(overrides=["reward.fn=my_reward.py:fails_on_three", "reward.on_error=skip_group"])
    reward = build_weighted_reward(cfg)
    groups = [Group(problem=PROBLEM, prompt_ids=(1,), completions=(completion("2"), completion("3"))),
              Group(problem=PROBLEM, prompt_ids=(1,), completions=(completion("2"), completion("2")))]
    skipped, scored = score_groups(groups, reward, on_error=cfg.reward.on_error)
    assert skipped.rewards is None and "a bug in the reward" in skipped.reward_error
    assert scored.rewards == (1.0, 1.0) and scored.reward_error is None
    with pytest.raises(RewardError, match="a bug in the reward"):
        score_groups(groups, reward, on_error="stop")
