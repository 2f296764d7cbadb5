"""Experiment trackers: a tiny run logged to Weights & Biases in its offline mode, checked in the
files W&B writes (the run's record log and the rollout tables), and the refusal when the package is
missing."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from reasonrl import load_config, train
from reasonrl.training.logging import WANDB_ROLLOUT_COLUMNS

pytest.importorskip("wandb")

FILE_HEADER = 7  # ":W&B", a 2-byte magic, a version byte
BLOCK = 32 * 1024  # the log is cut in LevelDB-style blocks; a record never starts in a block's last 6 bytes
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> list:
    """The protobuf records of a .wandb file (the LevelDB log format W&B writes offline runs in)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    records, pending, offset = [], b"", FILE_HEADER
    while offset + 7 <= len(data):
        if BLOCK - offset % BLOCK < 7:  # the block's tail is padding
            offset += BLOCK - offset % BLOCK
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[offset : offset + 7])
        payload = data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        if kind == 0 and length == 0:  # zero fill (LevelDB's preallocated space): go on at the next block
            offset += BLOCK - offset % BLOCK if offset % BLOCK else 0
            continue
        pending = payload if kind in (FULL, FIRST) else pending + payload
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def finished_records(path: Path, timeout_s: float = 60.0) -> list:
    """The records of an offline run's .wandb file once its writer has added the final "exit"
    record: W&B's service process writes the file on its own time, and on a loaded machine it may
    not have written the records when `run.finish()` returns."""
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            records = wandb_records(path)
        except DecodeError:  # a record being written
            if time.monotonic() > deadline:
                raise
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def nested(items) -> dict:
    """A history record's items as a dict: a logged object (a table) is spread over nested keys."""
    values: dict = {}
    for item in items:
        *parents, last = [item.key] if item.key else list(item.nested_key)
        target = values
        for key in parents:
            target = target.setdefault(key, {})
        target[last] = json.loads(item.value_json)
    return values


def test_wandb_offline_run_holds_the_metrics_the_config_and_the_rollout_table(tiny_model_dir, tmp_path, monkeypatch):
    from reasonrl import Problem, Task

    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    task = Task(name="letters", train=[Problem(id=str(i), prompt=f"say {i}", answer="a") for i in range(8)],
                test=[Problem(id="t", prompt="say", answer="a")])
    run_dir = tmp_path / "run"
    cfg = load_config(overrides=[
        f"model.name={tiny_model_dir}", f"run.dir={run_dir}", "run.progress=false", "run.tensorboard=false",
        "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=4", "eval.problems=0",
        "train.steps=2", "train.lr=3e-3", "run.save_every=0",
        "run.wandb=true", "run.wandb_mode=offline", "run.wandb_project=tiny-project", "run.wandb_name=tiny-run",
        'run.wandb_tags=["grpo", "test"]', "run.wandb_rollouts=3"])
    train(cfg, task=task, reward=lambda text, problem: text.count("a") / max(len(text), 1))

    run_id = (run_dir / "wandb_run_id").read_text().strip()
    (offline,) = (run_dir / "wandb").glob(f"offline-run-*-{run_id}")
    records = finished_records(offline / f"run-{run_id}.wandb")
    kinds = [r.WhichOneof("record_type") for r in records]
    assert "run" in kinds, kinds
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (run.project, run.display_name, list(run.tags)) == ("tiny-project", "tiny-run", ["grpo", "test"])
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    config |= {item.key: json.loads(item.value_json) for r in records if r.WhichOneof("record_type") == "config"
               for item in r.config.update}
    assert config["train"]["lr"] == pytest.approx(3e-3) and config["run"]["wandb"] is True

    history = [nested(r.history.item) for r in records if r.WhichOneof("record_type") == "history"]
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    scalars = [h for h in history if "reward/mean" in h]
    assert [h["step"] for h in scalars] == [m["step"] for m in logged] == [1, 2]
    assert [h["reward/mean"] for h in scalars] == pytest.approx([m["reward/mean"] for m in logged])
    assert "loss/policy" in scalars[0] and "history" in kinds

    tables = [h for h in history if "rollouts" in h]
    assert [t["step"] for t in tables] == [1, 2] and all(t["rollouts"]["_type"] == "table-file" for t in tables)
    rollouts = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    for table in tables:
        content = json.loads((offline / "files" / table["rollouts"]["path"]).read_text())
        assert content["columns"] == list(WANDB_ROLLOUT_COLUMNS)
        step_rollouts = [r for r in rollouts if r["step"] == table["step"]][:3]  # run.wandb_rollouts=3
        assert [row[:4] for row in content["data"]] == [[r["step"], r["problem_id"], r["prompt"], r["completion"]]
                                                        for r in step_rollouts]
        assert [row[5] for row in content["data"]] == pytest.approx([r["reward"] for r in step_rollouts])


def test_wandb_asked_for_but_missing_is_refused_before_the_run(tiny_model_dir, tmp_path, monkeypatch):
    import reasonrl.training.logging

    monkeypatch.setattr(reasonrl.training.logging, "find_spec", lambda name: None)
    cfg = load_config(overrides=[f"model.name={tiny_model_dir}", f"run.dir={tmp_path / 'run'}", "run.wandb=true"])
    with pytest.raises(ImportError, match=r"run.wandb=true needs the wandb package: pip install -e '\.\[wandb\]'"):
        train(cfg)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
