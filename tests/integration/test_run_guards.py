"""The guards of a training run, end to end on a tiny model: an alarm in the loop (its metric, its
warning, its marker in `reasonrl report`, and run.stop_on); the default job's alarms stay quiet."""

from __future__ import annotations

import json

import pytest
from test_train import TASK, share_of_a, tiny_config

from reasonrl import train
from reasonrl.alarms import AlarmError
from reasonrl.report import write_report

# Two epochs over each batch: the second epoch's importance ratios move off 1, which an
# alarm.ratio_max of 1 turns into a clip_outliers alarm at every step.
OFF_POLICY = ("train.steps=2", "train.ppo_epochs=2", "alarm.ratio_max=1.0")


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_an_alarm_is_logged_warned_and_marked_in_the_report(tiny_model_dir, tmp_path, capsys):
    train(tiny_config(tiny_model_dir, tmp_path, *OFF_POLICY), task=TASK, reward=share_of_a)
    logged = metrics(tmp_path)
    assert [m.get("alarm/clip_outliers") for m in logged] == [1.0, 1.0]
    assert all(m["loss/ratio_max"] > 1.0 for m in logged)
    err = capsys.readouterr().err
    assert err.count("warning: alarm clip_outliers") == 1  # at the onset only
    assert "alarm clip_outliers at step 1: loss/ratio_max" in err
    page = write_report(tmp_path).read_text()
    assert '<section id="alarms" class="alarms">' in page and "<b>clip_outliers</b> at steps 1-2" in page


def test_stop_on_stops_the_run_at_the_alarm(tiny_model_dir, tmp_path):
    with pytest.raises(AlarmError, match="alarm clip_outliers at step 1: loss/ratio_max"):
        train(tiny_config(tiny_model_dir, tmp_path, *OFF_POLICY, "run.stop_on=[\"clip_outliers\"]"), task=TASK,
              reward=share_of_a)


def test_no_alarm_without_the_tightened_threshold(tiny_model_dir, tmp_path):
    train(tiny_config(tiny_model_dir, tmp_path, "train.steps=2", "train.ppo_epochs=2"), task=TASK,
          reward=share_of_a)
    assert not any(key.startswith("alarm/") for m in metrics(tmp_path) for key in m)
