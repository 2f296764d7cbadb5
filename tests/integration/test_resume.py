"""Resume: a resume exactly at an epoch boundary continues as the straight run; a finished run is
reported complete (exit 0) instead of training zero steps; a changed config is refused naming the
keys unless run.resume_override; a process killed (SIGKILL) while writing a checkpoint resumes from
the previous one. And a resume keeps the run's record true: optimizer settings changed with
run.resume_override take effect on the restored optimizer (the logged train/lr says so); a refused
resume, a damaged checkpoint, a run.dir that is a file and a bad log line each print one line
naming the file and the fix, without a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import TASK, parameters, share_of_a, tiny_config, write_run

from reasonrl import load_config, train
from reasonrl.commands.cli import main
from reasonrl.config import ConfigError
from reasonrl.training.checkpoint import checkpoints, load_trainer_state
from reasonrl.training.runs import ResumeConfigError

# 16 training problems, 8 a step: an epoch is 2 steps.
EPOCH = ("rollout.prompts_per_step=8", "rollout.group_size=4", "run.save_every=2")


def rollouts(run_dir: Path) -> list[tuple]:
    lines = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    return [(r["step"], r["problem_id"], r["completion"]) for r in lines]


def test_a_resume_at_an_epoch_boundary_continues_as_the_straight_run(tiny_model_dir, tmp_path):
    train(tiny_config(tiny_model_dir, tmp_path / "straight", "train.steps=4", *EPOCH), task=TASK, reward=share_of_a)
    train(tiny_config(tiny_model_dir, tmp_path / "resumed", "train.steps=2", *EPOCH), task=TASK, reward=share_of_a)
    train(tiny_config(tiny_model_dir, tmp_path / "resumed", "train.steps=4", "run.resume=true", *EPOCH), task=TASK,
          reward=share_of_a)
    straight, resumed = rollouts(tmp_path / "straight"), rollouts(tmp_path / "resumed")
    first_epoch = {problem for step, problem, _ in straight if step <= 2}
    assert len(first_epoch) == len(TASK.train)  # the checkpoint at step 2 is exactly at the epoch's end
    assert {problem for step, problem, _ in straight if step > 2} == first_epoch  # a second epoch follows
    assert resumed == straight
    final = [parameters(tmp_path / run / "checkpoints" / "step_000004" / "policy") for run in ("straight", "resumed")]
    for name in final[0]:
        assert torch.equal(final[0][name], final[1][name]), name


def test_resuming_a_finished_run_says_it_is_complete_and_exits_0(tiny_model_dir, tmp_path, capsys):
    cfg_args = [f"model.name={tiny_model_dir}", f"run.dir={tmp_path}", "run.progress=false", "run.tensorboard=false",
                "rollout.dtype=float32", "train.dtype=float32", "rollout.max_new_tokens=4", "eval.problems=0",
                "train.steps=2"]
    assert main(["train", *cfg_args]) == 0
    logged = (tmp_path / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(["train", *cfg_args, "run.resume=true"]) == 0
    out = capsys.readouterr().out
    assert f"run {tmp_path} is already complete: its checkpoint step_000002 reached train.steps=2" in out
    assert (tmp_path / "metrics.jsonl").read_text() == logged  # nothing trained, evaluated or logged
    result = train(load_config(overrides=[*cfg_args, "run.resume=true"]))
    assert result.steps == 2 and result.eval_after is None


def test_a_changed_config_is_refused_naming_the_keys_unless_overridden(tiny_model_dir, tmp_path, capsys):
    train(tiny_config(tiny_model_dir, tmp_path, "train.steps=1", "run.save_every=1"), task=TASK, reward=share_of_a)
    changed = ("train.lr=5e-3", "rollout.group_size=4")
    with pytest.raises(ResumeConfigError) as error:
        train(tiny_config(tiny_model_dir, tmp_path, "train.steps=2", "run.resume=true", *changed), task=TASK,
              reward=share_of_a)
    message = str(error.value)
    assert "train.lr (0.01 -> 0.005)" in message and "rollout.group_size (8 -> 4)" in message
    assert "run.resume_override=true" in message and "train.steps" not in message
    assert [p.name for p in checkpoints(tmp_path)] == ["step_000001"]  # nothing trained
    # What does not change training may change: steps, evaluation, logging, guards.
    train(tiny_config(tiny_model_dir, tmp_path, "train.steps=2", "run.resume=true", "run.log_every=1",
                      "alarm.kl_max=2.0", "eval.samples=1"), task=TASK, reward=share_of_a)
    capsys.readouterr()
    train(tiny_config(tiny_model_dir, tmp_path, "train.steps=3", "run.resume=true", "run.resume_override=true",
                      *changed), task=TASK, reward=share_of_a)
    assert "run.resume_override: resuming" in capsys.readouterr().out
    assert [p.name for p in checkpoints(tmp_path)][-1] == "step_000003"


CHILD = """
import sys, time, torch
from helpers import TASK, share_of_a, tiny_config
from reasonrl import load_config, train
from reasonrl.config import ConfigError

model_dir, run_dir, flag = sys.argv[1:4]
save = torch.save

def stalling_save(obj, path, *args, **kwargs):
    if "step_000002" in str(path):  # the second checkpoint: hold the write open until killed
        open(flag, "w").close()
        time.sleep(600)
    return save(obj, path, *args, **kwargs)

torch.save = stalling_save
train(tiny_config(model_dir, run_dir, "train.steps=3", "run.save_every=1"), task=TASK, reward=share_of_a)
"""


def test_a_kill_during_a_checkpoint_write_resumes_from_the_previous_checkpoint(tiny_model_dir, tmp_path, capsys):
    run_dir, flag = tmp_path / "run", tmp_path / "writing"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tiny_model_dir), str(run_dir), str(flag)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 600
        while not flag.exists():
            assert child.poll() is None, child.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the child never reached its second checkpoint"
            time.sleep(0.2)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    root = run_dir / "checkpoints"
    assert [p.name for p in checkpoints(run_dir)] == ["step_000001"]
    assert [p.name for p in root.iterdir() if p.name.startswith(".step_000002")]  # the half-written one, hidden
    capsys.readouterr()
    result = train(tiny_config(tiny_model_dir, run_dir, "train.steps=3", "run.save_every=1", "run.resume=true"),
                   task=TASK, reward=share_of_a)
    assert f"resuming from checkpoint {root / 'step_000001'} (step 1)" in capsys.readouterr().out
    assert result.steps == 3
    assert [p.name for p in checkpoints(run_dir)] == ["step_000002", "step_000003"]
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # the leftover is cleaned up


def metrics(run_dir) -> dict[int, dict]:
    return {m["step"]: m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def test_optimizer_settings_changed_on_resume_take_effect(tiny_model_dir, tmp_path, capsys):
    train(tiny_config(tiny_model_dir, tmp_path, "train.steps=1", "run.save_every=1"), task=TASK, reward=share_of_a)
    assert metrics(tmp_path)[1]["train/lr"] == pytest.approx(1e-2)
    train(tiny_config(tiny_model_dir, tmp_path, "train.steps=2", "run.resume=true", "run.resume_override=true",
                      "train.lr=5e-3", "train.warmup_steps=4", "train.weight_decay=0.1"), task=TASK, reward=share_of_a)
    assert "train.lr (0.01 -> 0.005)" in capsys.readouterr().out
    # One optimizer step a step: step 2 is the schedule's second, at 2/4 of the warm-up.
    assert metrics(tmp_path)[2]["train/lr"] == pytest.approx(5e-3 * 2 / 4)
    groups = load_trainer_state(tmp_path / "checkpoints" / "step_000002")["learner"]["optimizer"]["param_groups"]
    assert [(g["initial_lr"], g["weight_decay"]) for g in groups] == [(5e-3, 0.1)]
    assert "\nlr = 0.005\n" in (tmp_path / "config.toml").read_text()  # the run's record says what it trained with


def test_a_decaying_learning_rate_spans_the_run_and_resumes_where_it_stopped(tiny_model_dir, tmp_path):
    # 4 steps of one optimizer step each, decaying linearly from 1e-2: 1, 3/4, 1/2, 1/4 of it; a run
    # stopped after step 2 and resumed takes up the same schedule.
    settings = ("train.steps=4", "run.save_every=1", "train.lr_schedule=linear")
    train(tiny_config(tiny_model_dir, tmp_path / "whole", *settings), task=TASK, reward=share_of_a)
    assert [m["train/lr"] for m in metrics(tmp_path / "whole").values()] == pytest.approx([1e-2, 7.5e-3, 5e-3, 2.5e-3])
    train(tiny_config(tiny_model_dir, tmp_path / "resumed", *settings, "train.max_generated_tokens=1"), task=TASK,
          reward=share_of_a)
    train(tiny_config(tiny_model_dir, tmp_path / "resumed", *settings, "run.resume=true", "run.resume_override=true"),
          task=TASK,
          reward=share_of_a)
    assert [m["train/lr"] for m in metrics(tmp_path / "resumed").values()] == pytest.approx([1e-2, 7.5e-3, 5e-3, 2.5e-3])
    with pytest.raises(ConfigError, match="train.warmup_steps=4 spans the run's 4 optimizer steps"):
        train(tiny_config(tiny_model_dir, tmp_path / "refused", *settings, "train.warmup_steps=4"), task=TASK,
              reward=share_of_a)


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
