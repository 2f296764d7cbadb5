"""The guards of a training run, end to end on a tiny model: an alarm in the loop (its metric, its
warning, its marker in `reasonrl report`, and run.stop_on); the hang watchdog on a reward that
sleeps."""

from __future__ import annotations

import pytest
from helpers import TASK, first_character_code, run_metrics, tiny_config

from reasonrl import train
from reasonrl.guards.alarms import AlarmError
from reasonrl.report import write_report

# Two epochs over each batch: the second epoch's importance ratios move off 1 (a reward with a spread
# in every group makes every step update), which an alarm.ratio_max of 1 turns into a clip_outliers
# alarm at every step.
OFF_POLICY = ("train.steps=2", "train.ppo_epochs=2", "alarm.ratio_max=1.0")


def test_an_alarm_is_logged_warned_and_marked_in_the_report(tiny_model_dir, tmp_path, capsys):
    train(tiny_config(tiny_model_dir, tmp_path, *OFF_POLICY), task=TASK, reward=first_character_code)
    logged = run_metrics(tmp_path)
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
              reward=first_character_code)


def test_no_alarm_without_the_tightened_threshold(tiny_model_dir, tmp_path):
    train(tiny_config(tiny_model_dir, tmp_path, "train.steps=2", "train.ppo_epochs=2"), task=TASK,
          reward=first_character_code)
    assert not any(key.startswith("alarm/") for m in run_metrics(tmp_path) for key in m)


class SleepyReward:
    """first_character_code, but the first completion of step `step` takes `sleep_s` to score."""

    def __init__(self, step: int, sleep_s: float, per_step: int = 32):
        self.calls, self.at, self.sleep_s = 0, (step - 1) * per_step, sleep_s

    def __call__(self, completion, problem):
        self.calls += 1
        if self.calls == self.at + 1:
            import time

            time.sleep(self.sleep_s)
        return first_character_code(completion, problem)


def test_a_reward_that_sleeps_is_reported_with_the_stacks_once(tiny_model_dir, tmp_path, capfd):
    train(tiny_config(tiny_model_dir, tmp_path, "train.steps=5", "run.hang_factor=5", "run.hang_floor_s=0.5"),
          task=TASK, reward=SleepyReward(step=4, sleep_s=4.0))
    err = capfd.readouterr().err
    assert err.count("warning: phase 'reward' has been running for") == 1, err
    report = err.split("warning: phase 'reward'")[1]
    assert "File " in report and "in __call__" in report  # faulthandler's stacks: the line it sleeps on
    assert len(run_metrics(tmp_path)) == 5  # only a report: the run went on
