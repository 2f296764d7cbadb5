"""A run's files under damage and kills: the logs a resume cuts (in place, a kill at any point of it
losing no line before the resume point), the one reader of those logs (a cut-off last line dropped
with a warning, any other bad line an error naming file and line), checkpoints checked against
their manifest (a damaged newest one refused naming the file, or skipped with run.resume=latest_valid),
and the refusals of a resume that would splice two runs."""

from __future__ import annotations

import json
import multiprocessing
import random
import re
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from reasonrl.config import ConfigError, load_config
from reasonrl.training.checkpoint import (
    MANIFEST,
    CheckpointError,
    checkpoints,
    load_policy_weights,
    load_trainer_state,
    save_checkpoint,
)
from reasonrl.training.jsonl import RunFileError, records
from reasonrl.training.logging import RunLogger
from reasonrl.training.runs import ResumeConfigError, RunDirPathError, start_run


def write_log(path: Path, steps: range, per_step: int = 2, text: str = "x") -> bytes:
    content = "".join(json.dumps({"step": step, "index": i, "completion": text}) + "\n"
                      for step in steps for i in range(per_step)).encode()
    path.write_bytes(content)
    return content


def end_of_step(content: bytes, step: int) -> int:
    """The byte offset just past the last line of `step` or earlier."""
    offset = 0
    for line in content.splitlines(keepends=True):
        if json.loads(line)["step"] > step:
            break
        offset += len(line)
    return offset


# ----------------------------------------------------------------------------------------- the logs


@pytest.mark.parametrize(("line", "says"), [
    (b'{"step": 2, "text": "caf\xe9"}\n', "is not UTF-8 text"),
    (b'{"step": 2, oops}\n', "is not valid JSON"),
    (b'[2, 3]\n', "is not a JSON object (it is a list)"),
    (b'{"reward": 0.5}\n', 'has no "step"'),
    (b'{"step": "2"}\n', 'has a "step" that is not an integer'),
])
def test_a_bad_line_before_the_last_names_the_file_and_the_line(tmp_path, line, says):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n' + line + b'{"step": 3}\n')
    with pytest.raises(RunFileError, match=rf"^{path}:2 {re.escape(says)}.*delete or repair line 2"):
        list(records(path))


def test_a_cut_off_last_line_is_dropped_with_a_warning(tmp_path, capsys):
    path = tmp_path / "rollouts.jsonl"
    path.write_bytes(b'{"step": 1}\n{"step": 2}\n{"step": 3, "completion": "the run was ki')
    assert [r["step"] for r in records(path)] == [1, 2]
    assert f"warning: {path}: skipped the cut-off last line 3" in capsys.readouterr().err


def test_a_resume_cuts_its_logs_in_place_after_its_step(tmp_path, capsys):
    rollouts = write_log(tmp_path / "rollouts.jsonl", range(1, 6))
    metrics = write_log(tmp_path / "metrics.jsonl", range(1, 6))
    (tmp_path / "metrics.jsonl").write_bytes(metrics + b'{"step": 6, "rew')  # killed mid-write
    inode = (tmp_path / "rollouts.jsonl").stat().st_ino
    RunLogger(tmp_path, tensorboard=False, resume_step=3)
    assert (tmp_path / "rollouts.jsonl").read_bytes() == rollouts[:end_of_step(rollouts, 3)]
    assert (tmp_path / "rollouts.jsonl").stat().st_ino == inode  # cut in place, not rewritten
    assert [r["step"] for r in records(tmp_path / "metrics.jsonl")] == [1, 1, 2, 2, 3, 3]
    assert capsys.readouterr().err == ""  # the cut-off line lay past step 3: nothing to say
    # A cut-off last line before the resume point is dropped with a warning.
    with (tmp_path / "metrics.jsonl").open("ab") as f:
        f.write(b'{"step": 3, "eval/acc')
    RunLogger(tmp_path, tensorboard=False, resume_step=3)
    assert "dropped the cut-off last line 7" in capsys.readouterr().err
    assert [r["step"] for r in records(tmp_path / "metrics.jsonl")] == [1, 1, 2, 2, 3, 3]


def test_a_log_that_lost_lines_before_the_resume_point_is_reported(tmp_path, capsys):
    write_log(tmp_path / "metrics.jsonl", range(1, 11))
    (tmp_path / "rollouts.jsonl").write_bytes(b"")  # emptied by a crash
    RunLogger(tmp_path, tensorboard=False, resume_step=10)
    err = capsys.readouterr().err
    assert f"{tmp_path / 'rollouts.jsonl'} holds no line, but the run resumes from step 10" in err
    assert "metrics.jsonl" not in err


def test_a_missing_metrics_log_is_reported_on_resume(tmp_path, capsys):
    write_log(tmp_path / "rollouts.jsonl", range(1, 5))
    RunLogger(tmp_path, tensorboard=False, resume_step=4)
    err = capsys.readouterr().err
    assert f"{tmp_path / 'metrics.jsonl'} is missing, but the run resumes from step 4" in err
    assert "rollouts.jsonl" not in err
    (tmp_path / "rollouts.jsonl").unlink()  # an SFT stage writes no rollouts: nothing to say about them
    write_log(tmp_path / "metrics.jsonl", range(1, 5))
    RunLogger(tmp_path, tensorboard=False, resume_step=4)
    assert capsys.readouterr().err == ""


def test_a_bad_line_before_the_resume_point_stops_the_resume_naming_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n\xff\xfe\n{"step": 2}\n')
    with pytest.raises(RunFileError, match=rf"{path}:2 is not UTF-8"):
        RunLogger(tmp_path, tensorboard=False, resume_step=2)
    assert path.read_bytes() == b'{"step": 1}\n\xff\xfe\n{"step": 2}\n'  # left as it was, for a look


RESUME_STEP = 90


def _resume_logs(run_dir: Path, started) -> None:
    started.set()
    RunLogger(run_dir, tensorboard=False, resume_step=RESUME_STEP)


def test_a_kill_at_a_random_point_of_a_resume_loses_no_line_before_it(tmp_path):
    """A process preparing a resume (cutting a 10 MB rollouts.jsonl and metrics.jsonl at step 90
    of 100) killed with SIGKILL after a random delay, over the whole time the preparation takes:
    each time, each log is whole or cut exactly after step 90, and parses."""
    templates = {"rollouts.jsonl": write_log(tmp_path / "rollouts.jsonl", range(1, 101), per_step=10,
                                             text="x" * 10_000),
                 "metrics.jsonl": write_log(tmp_path / "metrics.jsonl", range(1, 101), per_step=1)}
    fork = multiprocessing.get_context("fork")
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    def start() -> multiprocessing.Process:
        for name, content in templates.items():
            (run_dir / name).write_bytes(content)
        started = fork.Event()
        child = fork.Process(target=_resume_logs, args=(run_dir, started))
        child.start()
        assert started.wait(60)
        return child

    child = start()  # how long a preparation takes, left to finish
    began = time.perf_counter()
    child.join()
    duration = time.perf_counter() - began
    rng, killed, attempts = random.Random(0), 0, 0
    while killed < 10 and attempts < 80:  # ten kills midway, at random points of the preparation
        attempts += 1
        child = start()
        time.sleep(rng.uniform(0, duration))
        child.kill()
        child.join()
        if child.exitcode == -signal.SIGKILL:
            killed += 1
        else:  # finished before the kill: the machine got faster, aim earlier
            duration *= 0.7
        for name, content in templates.items():
            found = (run_dir / name).read_bytes()
            assert found in (content, content[:end_of_step(content, RESUME_STEP)]), (name, child.exitcode)
            assert all(r["step"] >= 1 for r in records(run_dir / name))
    assert killed == 10, f"only {killed} of {attempts} preparations were killed before they finished"


# ----------------------------------------------------------------------------------------- checkpoints


class Saves:
    """A model and tokenizer that save as a policy directory: one safetensors file of weights."""

    def save_pretrained(self, directory: Path) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        save_file({"weight": torch.arange(4096, dtype=torch.float32)}, Path(directory) / "model.safetensors")


def run_with_checkpoints(run_dir: Path, *steps: int, manifest: bool = True) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    load_config(overrides=[f"run.dir={run_dir}"]).save(run_dir / "config.toml")
    for step in steps:
        checkpoint = save_checkpoint(run_dir, step, model=Saves(), tokenizer=Saves(),
                                     state={"sampler": torch.zeros(1000)}, keep=5)
        if not manifest:
            (checkpoint / MANIFEST).unlink()


def resume(run_dir: Path, *overrides: str):
    start = start_run(load_config(overrides=[f"run.dir={run_dir}", "run.resume=true", *overrides]))
    start.lock.release()
    return start.resume_from


def corrupt_4kb(path: Path) -> None:
    with path.open("r+b") as f:
        f.seek(2000)
        f.write(bytes(4096))


DAMAGES = {
    "weights cut short": ("policy/model.safetensors", lambda p: p.write_bytes(p.read_bytes()[:-100])),
    "weights emptied": ("policy/model.safetensors", lambda p: p.write_bytes(b"")),
    "4 KB of weights zeroed": ("policy/model.safetensors", corrupt_4kb),
    "trainer state cut short": ("trainer_state.pt", lambda p: p.write_bytes(p.read_bytes()[:-50])),
    "trainer state emptied": ("trainer_state.pt", lambda p: p.write_bytes(b"")),
    "trainer state deleted": ("trainer_state.pt", Path.unlink),
}


def test_a_checkpoint_holds_the_size_and_sha256_of_every_file(tmp_path):
    run_with_checkpoints(tmp_path, 1)
    checkpoint = tmp_path / "checkpoints" / "step_000001"
    files = json.loads((checkpoint / MANIFEST).read_text())["files"]
    assert set(files) == {"trainer_state.pt", "policy/model.safetensors"}
    import hashlib

    state = (checkpoint / "trainer_state.pt").read_bytes()
    assert files["trainer_state.pt"] == {"bytes": len(state), "sha256": hashlib.sha256(state).hexdigest()}
    assert resume(tmp_path) == checkpoint


@pytest.mark.parametrize("kind", DAMAGES)
def test_a_damaged_newest_checkpoint_is_refused_naming_the_file_and_the_previous_one(tmp_path, kind):
    run_with_checkpoints(tmp_path, 1, 2)
    name, spoil = DAMAGES[kind]
    newest = tmp_path / "checkpoints" / "step_000002"
    spoil(newest / name)
    with pytest.raises(CheckpointError) as error:
        resume(tmp_path)
    message = str(error.value)
    assert f"checkpoint {newest} is damaged: {newest / name}" in message
    assert "run.resume=latest_valid" in message and "step_000001 is the next" in message
    assert [p.name for p in checkpoints(tmp_path)] == ["step_000001", "step_000002"]  # nothing moved


def test_latest_valid_resumes_from_the_newest_intact_checkpoint_with_a_warning(tmp_path, capsys):
    run_with_checkpoints(tmp_path, 1, 2, 3)
    corrupt_4kb(tmp_path / "checkpoints" / "step_000003" / "policy" / "model.safetensors")
    (tmp_path / "checkpoints" / "step_000002" / "trainer_state.pt").write_bytes(b"")
    assert resume(tmp_path, "run.resume=latest_valid") == tmp_path / "checkpoints" / "step_000001"
    err = capsys.readouterr().err
    assert "checkpoint" in err and "step_000003 is damaged" in err and "step_000002 is damaged" in err
    assert [p.name for p in checkpoints(tmp_path)] == ["step_000001"]
    assert (tmp_path / "checkpoints" / "damaged-step_000003").is_dir()  # set aside, for a look
    # Nothing intact at all: an error, not a fresh start.
    (tmp_path / "checkpoints" / "step_000001" / "trainer_state.pt").unlink()
    with pytest.raises(CheckpointError, match="found no intact checkpoint"):
        resume(tmp_path, "run.resume=latest_valid")


def test_a_checkpoint_without_a_manifest_resumes_with_a_warning_unless_a_file_is_not_whole(tmp_path, capsys):
    run_with_checkpoints(tmp_path, 1, 2, manifest=False)
    newest = tmp_path / "checkpoints" / "step_000002"
    assert resume(tmp_path) == newest
    assert "written without checksums" in capsys.readouterr().err
    (newest / "policy" / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match=rf"{newest / 'policy' / 'model.safetensors'} is not a whole"):
        resume(tmp_path)
    (newest / "policy" / "model.safetensors").unlink()
    (newest / "trainer_state.pt").write_bytes((tmp_path / "checkpoints" / "step_000001" / "trainer_state.pt")
                                              .read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"trainer_state.pt is not a whole torch.save file"):
        resume(tmp_path)


def test_a_file_that_cannot_be_loaded_is_named_with_its_checkpoint_and_the_way_back(tmp_path):
    run_with_checkpoints(tmp_path, 1, 2)
    newest = tmp_path / "checkpoints" / "step_000002"
    (newest / "trainer_state.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=rf"{newest / 'trainer_state.pt'} of checkpoint {newest} cannot be "
                                              rf"loaded .*to resume from step_000001, move it aside \(mv {newest}"):
        load_trainer_state(newest)
    (newest / "policy" / "model.safetensors").write_bytes(b"\x08")

    class Model(torch.nn.Module):
        pass

    with pytest.raises(CheckpointError, match=rf"model.safetensors of checkpoint {newest} cannot be loaded"):
        load_policy_weights(Model(), newest)


# ----------------------------------------------------------------------------------------- refusals


def test_a_resume_without_the_runs_config_is_refused_unless_overridden(tmp_path, capsys):
    run_with_checkpoints(tmp_path, 1)
    (tmp_path / "config.toml").unlink()
    with pytest.raises(ResumeConfigError, match=rf"{tmp_path / 'config.toml'} is missing.*run.resume_override=true"):
        resume(tmp_path)
    assert resume(tmp_path, "run.resume_override=true") == tmp_path / "checkpoints" / "step_000001"
    assert "without its config.toml" in capsys.readouterr().out


def test_a_key_the_checkpoint_fixes_is_refused_even_with_the_override(tmp_path):
    run_with_checkpoints(tmp_path, 1)
    with pytest.raises(ResumeConfigError, match=r"train.lora_rank cannot change on resume \(0 -> 8\): the "
                                                r"checkpoint holds"):
        resume(tmp_path, "run.resume_override=true", "train.lora_rank=8")
    assert (resume(tmp_path, "run.resume_override=true", "train.lr=1e-6", "train.weight_decay=0.1")
            == tmp_path / "checkpoints" / "step_000001")


def test_run_resume_takes_true_latest_and_latest_valid(tmp_path):
    assert load_config(overrides=["run.resume=true"]).run.resume == "latest"
    assert load_config(overrides=["run.resume=false"]).run.resume == "off"
    assert load_config(overrides=["run.resume=latest_valid"]).run.resume == "latest_valid"
    with pytest.raises(ConfigError, match="run.resume: 'yes' is not allowed; allowed: off, latest, latest_valid"):
        load_config(overrides=["run.resume=yes"])


def test_a_run_dir_naming_a_file_is_refused_naming_it(tmp_path):
    (tmp_path / "taken").write_text("")
    with pytest.raises(RunDirPathError, match=rf"run.dir {tmp_path / 'taken'} cannot be a directory: "
                                              rf"{tmp_path / 'taken'} is a file"):
        start_run(load_config(overrides=[f"run.dir={tmp_path / 'taken'}"]))
    with pytest.raises(RunDirPathError, match=rf"{tmp_path / 'taken'} is a file"):
        start_run(load_config(overrides=[f"run.dir={tmp_path / 'taken' / 'run'}"]))
