"""What a user sees when something is off: one line naming the setting and the fix, a resume hint on
Ctrl-C, no `.lock` left in a finished run directory, the inspect table readable when piped."""

from __future__ import annotations

import json
import re

import pytest
from helpers import TASK, share_of_a, tiny_config, write_run

from reasonrl import train
from reasonrl.commands.cli import main
from reasonrl.commands.inspect_run import PIPED_WIDTH, inspect_run
from reasonrl.models import ModelNotFoundError, load_model, load_tokenizer
from reasonrl.training.skeleton import RunInterrupted

SHARING_NOTICE = re.compile(r"reasonrl: (warning: \d+ reasonrl runs take|\d+ runs share) ")
# What a run says at its start on a CPU without bfloat16 units (models.cpu_dtype_note), before any error.
FLOAT32_NOTICE = re.compile(r"warning: this CPU has no bfloat16 matrix units ")


def errors_only(stderr: str) -> str:
    """stderr without the notices a run prints as it starts: other runs (e.g. other test workers) sharing
    its cores, and a CPU without bfloat16 units."""
    return "\n".join(line for line in stderr.strip().splitlines()
                     if not SHARING_NOTICE.match(line) and not FLOAT32_NOTICE.match(line))


def test_an_override_without_a_value_is_named_not_taken_for_a_config_file(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["train", "grpo", "train.steps"])
    assert exited.value.code == 2
    assert "train.steps has no value: write train.steps=VALUE" in capsys.readouterr().err


def test_a_model_that_cannot_be_found_is_one_line_naming_the_setting(tmp_path, capsys):
    not_a_model = tmp_path / "weights.bin"
    not_a_model.write_bytes(b"x")
    assert main(["train", f"model.name={not_a_model}", f"run.dir={tmp_path / 'run'}"]) == 2
    err = errors_only(capsys.readouterr().err)
    assert err.count("\n") == 0 and err.startswith(f"reasonrl: model.name='{not_a_model}' is a file")
    for load in (load_model, load_tokenizer):  # a teacher's names its own setting
        with pytest.raises(ModelNotFoundError, match=r"^distill.teacher="):
            load(str(not_a_model), **({"dtype": None, "device": None} if load is load_model else {}),
                 setting="distill.teacher")


def test_a_finished_run_leaves_no_lock_and_resumes(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    train(tiny_config(tiny_model_dir, run, "train.steps=1"), task=TASK, reward=share_of_a)
    assert not (run / ".lock").exists()
    train(tiny_config(tiny_model_dir, run, "train.steps=2", "run.resume=true"), task=TASK, reward=share_of_a)
    assert not (run / ".lock").exists()
    # it went on from step 1: one more step trained, not two
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
             if "loss/policy" in json.loads(line)]
    assert steps == [1, 2]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000001", "step_000002"]


def test_ctrl_c_during_the_steps_says_where_it_stopped_and_how_to_resume(tiny_model_dir, tmp_path):
    calls = []

    def interrupted_in_step_two(completion: str, problem) -> float:
        calls.append(1)
        if len(calls) > 32:  # the second step's scoring (4 problems x 8 samples a step)
            raise KeyboardInterrupt
        return share_of_a(completion, problem)

    run = tmp_path / "run"
    with pytest.raises(RunInterrupted) as stopped:
        train(tiny_config(tiny_model_dir, run, "train.steps=3", "run.save_every=1"), task=TASK,
              reward=interrupted_in_step_two)
    message = str(stopped.value)
    assert message.startswith("interrupted at step 1 of 3; its last checkpoint is ")
    assert message.endswith(f"resume with `reasonrl train {run / 'config.toml'} run.resume=true`")
    assert not (run / ".lock").exists()


def test_inspect_shows_the_question_and_is_wide_when_piped(tmp_path, capsys):
    run = write_run(tmp_path / "run")
    assert inspect_run(run, step=3, chars=400) == 0
    out = capsys.readouterr().out
    assert "What is p1?" in out and max(len(line) for line in out.splitlines()) > 80
    assert max(len(line) for line in out.splitlines()) <= PIPED_WIDTH


def test_a_reward_that_cannot_be_imported_is_one_line_before_the_model_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # model.name names nothing either: the reward's error comes first.
    assert main(["train", "reward.fn=rewards/mine.py:score", "model.name=/nowhere/model", "run.dir=run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("reasonrl: config error: reward.fn: 'rewards/mine.py:score': no file")
    assert not (tmp_path / "run").exists()


def test_a_python_reward_with_knobs_it_replaces_is_refused_before_the_run_starts(tmp_path):
    from reasonrl import load_config
    from reasonrl.config import ConfigError

    cfg = load_config(overrides=["reward.overlong_buffer=4", f"run.dir={tmp_path / 'run'}", "model.name=/nowhere"])
    with pytest.raises(ConfigError, match="reward.overlong_buffer=4: no effect"):
        train(cfg, task=TASK, reward=share_of_a)
    assert not (tmp_path / "run").exists()


def test_a_problem_with_its_own_system_message_beside_model_system_prompt_is_one_line(tiny_model_dir, tmp_path,
                                                                                      capsys):
    import json

    data = tmp_path / "chat.jsonl"
    conversation = [{"role": "system", "content": "You are a tutor."}, {"role": "user", "content": "1+1?"}]
    data.write_text("".join(json.dumps({"question": conversation, "answer": "2"}) + "\n" for _ in range(4)))
    code = main(["train", f"model.name={tiny_model_dir}", f"run.dir={tmp_path / 'run'}", "task.name=jsonl",
                 f"task.train_path={data}", "task.test_size=1", "model.system_prompt=Be brief."])
    err = errors_only(capsys.readouterr().err)
    assert code == 2 and err.count("\n") == 0
    assert err.startswith("reasonrl: config error: problem ") and "system message of its own" in err


def test_ctrl_c_in_a_stage_says_where_it_stopped_and_how_to_resume(tiny_model_dir, tmp_path):
    from reasonrl.stages.rft import train_rft

    calls = []

    def interrupted_in_round_two(completion: str, problem) -> float:
        calls.append(1)
        if len(calls) > 2 * 8:  # the second round's scoring (2 problems x 8 samples a round)
            raise KeyboardInterrupt
        return share_of_a(completion, problem)

    run = tmp_path / "rft"
    with pytest.raises(RunInterrupted) as stopped:
        train_rft(tiny_config(tiny_model_dir, run, "train.steps=3", "run.save_every=1", "rft.problems_per_round=2",
                              "rft.steps_per_round=1"), task=TASK, reward=interrupted_in_round_two)
    message = str(stopped.value)
    assert message.startswith(f"interrupted at step 1 of 3; its last checkpoint is {run / 'checkpoints'}")
    assert message.endswith(f"resume with `reasonrl rft {run / 'config.toml'} run.resume=true`")  # not RL's train
    assert not (run / ".lock").exists()


def test_recipes_named_like_a_section_are_recipes():
    """`reasonrl train prime` and `reasonrl train distill` name shipped recipes, whose names are also
    config sections: they were refused as overrides without a value."""
    from reasonrl.commands.cli import _config_arguments, _parser

    parser = _parser()
    for recipe in ("prime", "distill", "prime.toml"):
        assert _config_arguments(parser, [recipe, "run.seed=3"]) == ([recipe], ["run.seed=3"])
    with pytest.raises(SystemExit):
        _config_arguments(parser, ["prime", "prime.lr"])
