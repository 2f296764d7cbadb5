"""A resume that keeps the run's record true, and the command line's one-line errors for run files:
optimizer settings changed with run.resume_override take effect on the restored optimizer (the
logged train/lr says so); a refused resume, a damaged checkpoint, a run.dir that is a file and a
bad log line each print one line naming the file and the fix, without a traceback."""

from __future__ import annotations

import json

import pytest
from test_report import write_run
from test_train import TASK, share_of_a, tiny_config

from reasonrl import train
from reasonrl.cli import main
from reasonrl.training.checkpoint import load_trainer_state


def metrics(run_dir) -> dict[int, dict]:
    return {m["step"]: m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def test_optimizer_settings_changed_on_resume_take_effect(tiny_model_dir, tmp_path, capsys):
    train(tiny_config(tiny_model_dir, tmp_path, "train.steps=1", "run.save_every=1"), task=TASK, reward=share_of_a)
    assert metrics(tmp_path)[1]["train/lr"] == pytest.approx(1e-2)
    train(tiny_config(tiny_model_dir, tmp_path, "train.steps=2", "run.resume=true", "run.resume_override=true",
                      "train.lr=5e-3", "train.warmup_steps=4", "train.weight_decay=0.1"), task=TASK, reward=share_of_a)
    assert "train.lr (0.01 -> 0.005)" in capsys.readouterr().out
    # One optimizer step a step: the schedule resumes at its second step and the third starts after step 2.
    assert metrics(tmp_path)[2]["train/lr"] == pytest.approx(5e-3 * 3 / 4)
    groups = load_trainer_state(tmp_path / "checkpoints" / "step_000002")["learner"]["optimizer"]["param_groups"]
    assert [(g["initial_lr"], g["weight_decay"]) for g in groups] == [(5e-3, 0.1)]
    assert "\nlr = 0.005\n" in (tmp_path / "config.toml").read_text()  # the run's record says what it trained with


def cli_args(model_dir, run_dir, *extra: str) -> list[str]:
    return ["train", f"model.name={model_dir}", f"run.dir={run_dir}", "run.progress=false", "run.tensorboard=false",
            "rollout.dtype=float32", "train.dtype=float32", "rollout.max_new_tokens=4", "eval.problems=0", *extra]


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_refused_resumes_print_one_line_naming_the_file_and_the_fix(tiny_model_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(cli_args(tiny_model_dir, run_dir, "train.steps=1")) == 0
    capsys.readouterr()
    assert main(cli_args(tiny_model_dir, run_dir, "train.steps=2", "run.resume=true", "train.lr=1e-3")) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("reasonrl: run.resume=true, but the config differs") and "train.lr" in line
    (run_dir / "checkpoints" / "step_000001" / "trainer_state.pt").write_bytes(b"")
    assert main(cli_args(tiny_model_dir, run_dir, "train.steps=2", "run.resume=true")) == 2
    line = one_line(capsys.readouterr().err)
    assert f"checkpoint {run_dir / 'checkpoints' / 'step_000001'} is damaged" in line and "trainer_state.pt" in line
    (run_dir / "config.toml").unlink()
    assert main(cli_args(tiny_model_dir, run_dir, "train.steps=2", "run.resume=true")) == 2
    assert f"{run_dir / 'config.toml'} is missing" in one_line(capsys.readouterr().err)
    assert main(cli_args(tiny_model_dir, run_dir / "metrics.jsonl" / "x", "train.steps=1")) == 2
    assert "is a file" in one_line(capsys.readouterr().err)
    (tmp_path / "file").write_text("")
    assert main(cli_args(tiny_model_dir, tmp_path / "file", "train.steps=1")) == 2
    assert f"run.dir {tmp_path / 'file'} cannot be a directory" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize(("line", "says"), [
    (b'{"step": 2, "reward/mean": 0.5, "note": "\xff"}\n', "is not UTF-8 text"),
    (b'{"reward/mean": 0.5}\n', 'has no "step"'),
    (b'"step 2"\n', "is not a JSON object"),
])
@pytest.mark.parametrize("command", ["report", "inspect"])
def test_report_and_inspect_name_a_bad_log_line_in_one_line(tmp_path, capsys, command, line, says):
    run_dir = write_run(tmp_path / "run")
    metrics_path = run_dir / "metrics.jsonl"
    lines = metrics_path.read_bytes().splitlines(keepends=True)
    metrics_path.write_bytes(b"".join([lines[0], line, *lines[1:]]))
    assert main([command, str(run_dir)]) == 2
    assert one_line(capsys.readouterr().err).startswith(f"reasonrl {command}: {metrics_path}:2 {says}")


def test_a_resume_with_lost_log_lines_says_so_and_goes_on(tiny_model_dir, tmp_path, capsys):
    train(tiny_config(tiny_model_dir, tmp_path, "train.steps=2", "run.save_every=1"), task=TASK, reward=share_of_a)
    (tmp_path / "rollouts.jsonl").write_bytes(b"")
    train(tiny_config(tiny_model_dir, tmp_path, "train.steps=3", "run.resume=true"), task=TASK, reward=share_of_a)
    assert "rollouts.jsonl holds no line, but the run resumes from step 2" in capsys.readouterr().err
    assert {json.loads(line)["step"] for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()} == {3}
    assert sorted(metrics(tmp_path)) == [1, 2, 3]
