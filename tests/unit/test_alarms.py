"""The alarms on scripted metric streams: each fires when its signal crosses its threshold (at the
step it crosses, with the numbers in the warning), and none fires on a healthy stream taken from
a real run (tests/unit/data/grpo_recipe_metrics.jsonl: `reasonrl train grpo`, the default task and
model). run.stop_on makes an alarm stop the run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from reasonrl.config import AlarmConfig
from reasonrl.config.knobs import ALARMS as ALARM_NAMES
from reasonrl.guards.alarms import ALARMS, AlarmError, AlarmMonitor

# A real run: the grpo recipe (KL 0.04) on the default task and model, 20 steps; it learns (reward
# 0.12 -> 0.4-0.9), with the noise of 32 samples a step, a one-step KL and gradient-norm spike at
# step 9 and entropy falling from 0.8 to 0.2-0.4: all of which a default-on alarm must tolerate.
HEALTHY = Path(__file__).parent / "data" / "grpo_recipe_metrics.jsonl"

STEADY = {"entropy/mean": 0.8, "reward/mean": 0.4, "reward/correct": 0.35, "rollout/len_mean": 40.0,
          "rollout/truncated_frac": 0.2, "loss/clip_frac": 0.02, "loss/ratio_max": 1.3, "kl/mean": 0.01,
          "rollout/zero_std_frac": 0.5, "train/grad_norm": 1.0}


def stream(steps: int, **changes) -> list[dict[str, float]]:
    """`steps` steps of STEADY metrics, where each keyword (a metric with "/" written "__") gives a
    function of the step (1-based) replacing that metric."""
    lines = []
    for step in range(1, steps + 1):
        line = dict(STEADY)
        for key, value in changes.items():
            line[key.replace("__", "/")] = value(step)
        lines.append(line)
    return lines


def run(lines, thresholds=None, stop_on=()) -> tuple[list[dict[str, float]], list[str]]:
    warnings: list[str] = []
    monitor = AlarmMonitor(thresholds or AlarmConfig(), stop_on=stop_on, warn=warnings.append)
    return [monitor.observe(step, line) for step, line in enumerate(lines, start=1)], warnings


def first_firing(fired: list[dict[str, float]], name: str) -> int | None:
    return next((step for step, metrics in enumerate(fired, start=1) if f"alarm/{name}" in metrics), None)


# Each alarm's scripted stream (20 steps, the signal going bad from step 11), the step it must fire
# at, and words its warning must hold. With windows of 5, a windowed alarm sees step 11 in its last
# window; the signals are made to cross at a known step.
SCRIPTS = {
    # entropy 0.8 for 10 steps then 0.01: the last 5 steps' mean drops below 0.08 at the 5th bad step.
    "entropy_collapse": ({"entropy__mean": lambda s: 0.8 if s <= 10 else 0.01}, 15, "entropy/mean 0.01"),
    # total reward climbs, correctness falls, from step 11 on.
    "reward_hacking": ({"reward__mean": lambda s: 0.4 if s <= 10 else 0.4 + 0.05 * (s - 10),
                            "reward__correct": lambda s: 0.35 if s <= 10 else 0.35 - 0.03 * (s - 10)}, 14,
                       "reward/correct fell"),
    "length_explosion": ({"rollout__len_mean": lambda s: 40.0 if s <= 10 else 400.0}, 12, "rollout/len_mean"),
    "truncation_surge": ({"rollout__truncated_frac": lambda s: 0.2 if s <= 10 else 0.9}, 13,
                         "rollout/truncated_frac"),
    "clip_outliers": ({"loss__clip_frac": lambda s: 0.02 if s <= 10 else 0.6}, 11, "loss/clip_frac 0.6"),
    # KL 10 from step 11: the last 5 steps' mean (2.008) passes 1 at once.
    "kl_blowup": ({"kl__mean": lambda s: 0.01 if s <= 10 else 10.0}, 11, "kl/mean 2.008"),
    "no_gradient": ({"rollout__zero_std_frac": lambda s: 0.5 if s <= 10 else 1.0}, 15, "rollout/zero_std_frac"),
    # gradient norm 50 from step 11: the last 5 steps' median is 50 from the 3rd such step.
    "grad_norm": ({"train__grad_norm": lambda s: 1.0 if s <= 10 else 50.0}, 13, "train/grad_norm 50"),
}


def test_every_alarm_has_a_script():
    assert set(SCRIPTS) == set(ALARMS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_each_alarm_fires_at_the_step_its_signal_crosses_and_names_the_numbers(name):
    changes, step, words = SCRIPTS[name]
    fired, warnings = run(stream(20, **changes))
    assert first_firing(fired, name) == step
    assert all(f"alarm/{name}" in fired[s - 1] for s in range(step, 21))  # it holds while the signal is bad
    assert {key for metrics in fired for key in metrics} == {f"alarm/{name}"}  # no other alarm fires
    assert len(warnings) == 1  # once, at the onset
    assert f"alarm {name} at step {step}: " in warnings[0] and words in warnings[0], warnings


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_each_alarm_stays_quiet_on_the_steady_stream(name):
    fired, warnings = run(stream(20))
    assert fired == [{}] * 20 and warnings == []


def healthy_stream() -> list[dict[str, float]]:
    return [{k: v for k, v in json.loads(line).items() if k != "step"} for line in HEALTHY.read_text().splitlines()]


def test_the_healthy_stream_of_a_real_run_raises_no_alarm():
    lines = healthy_stream()
    assert len(lines) == 20 and all(key in lines[0] for key in STEADY)
    fired, warnings = run(lines)
    assert fired == [{}] * len(lines) and warnings == []


def test_the_healthy_stream_trips_an_alarm_whose_threshold_is_tightened():
    """Not vacuous: the healthy stream holds the signals the alarms read (a too-tight threshold fires)."""
    fired, _ = run(healthy_stream(), AlarmConfig(window=2, entropy_ratio=0.5, grad_norm_factor=1.5, kl_max=0.5,
                                                zero_std_max=0.8))
    names = {key for metrics in fired for key in metrics}
    assert names == {"alarm/entropy_collapse", "alarm/grad_norm", "alarm/kl_blowup", "alarm/no_gradient"}, names


def test_with_dynamic_sampling_no_gradient_reads_the_share_of_groups_dropped():
    # The kept groups all have spread (zero_std_frac 0), yet 95% of the sampled groups were dropped from
    # step 11: the last 5 steps' mean of 0.5, 0.95 ... passes 0.9 at the 5th such step.
    lines = stream(20, rollout__zero_std_frac=lambda s: 0.0, sampling__dropped_frac=lambda s: 0.5 if s <= 10 else 0.95)
    fired, warnings = run(lines)
    assert first_firing(fired, "no_gradient") == 15 and "sampling/dropped_frac 0.95" in warnings[0]
    assert "dynamic sampling dropped almost every group" in warnings[0] and "dynamic_keep" not in warnings[0]
    # Most of the dropped groups had scores that differ (partial credit): the warning names the reward rule.
    # The last 5 steps: 0.6 of the sampled groups, at least half of the 0.95 dropped.
    graded = {"sampling__dropped_graded_frac": lambda s: 0.1 if s <= 10 else 0.6}
    _, partial = run(stream(20, rollout__zero_std_frac=lambda s: 0.0,
                            sampling__dropped_frac=lambda s: 0.5 if s <= 10 else 0.95, **graded))
    assert "in 0.6 of the sampled groups the checker's scores differed" in partial[0]
    assert "sampling.dynamic_keep=reward" in partial[0]
    _, plain = run(stream(20, rollout__zero_std_frac=lambda s: 0.5 if s <= 10 else 1.0))
    assert "dynamic" not in plain[0] and "one reward" in plain[0]  # without dynamic sampling: the groups' spread
    fired, _ = run(stream(20, rollout__zero_std_frac=lambda s: 0.0, sampling__dropped_frac=lambda s: 0.5))
    assert fired == [{}] * 20


def test_with_overlong_filtering_no_gradient_fires_when_almost_every_completion_is_cut():
    # Groups with spread (zero_std_frac 0.5) but 95% of the completions cut from step 11, and filtering
    # on: the last 5 steps' mean of 0.2, 0.95 ... passes 0.9 at the 5th such step.
    cut = {"rollout__zero_std_frac": lambda s: 0.5, "rollout__truncated_frac": lambda s: 0.2 if s <= 10 else 0.95}
    fired, warnings = run(stream(20, **cut, sampling__masked_truncated=lambda s: 30.0))
    assert first_firing(fired, "no_gradient") == 15
    assert "alarm no_gradient at step 15: rollout/truncated_frac 0.95" in warnings[1], warnings  # [0]: truncation_surge
    assert "sampling.mask_truncated" in warnings[1]
    # Without filtering the cut completions are learned from (their reward is low): only truncation_surge.
    fired, _ = run(stream(20, **cut))
    assert first_firing(fired, "no_gradient") is None and first_firing(fired, "truncation_surge") == 13


def test_with_dynamic_sampling_reward_hacking_reads_every_completion_sampled():
    # The kept groups (1..G-1 correct by the keep rule) look flat; over every completion sampled the
    # reward climbs while accuracy falls from step 11: the same crossing as the plain script (step 14).
    hacking = {"sampling__reward_mean_all": lambda s: 0.4 if s <= 10 else 0.4 + 0.05 * (s - 10),
               "sampling__accuracy_all": lambda s: 0.35 if s <= 10 else 0.35 - 0.03 * (s - 10)}
    fired, warnings = run(stream(20, **hacking))
    assert first_firing(fired, "reward_hacking") == 14 and "sampling/accuracy_all fell" in warnings[0]
    # The kept groups' numbers alone (reward/mean up, reward/correct down) are the keep rule's doing,
    # not the policy's, when the sampled completions hold steady.
    kept_only = {"reward__mean": lambda s: 0.4 if s <= 10 else 0.4 + 0.05 * (s - 10),
                 "reward__correct": lambda s: 0.35 if s <= 10 else 0.35 - 0.03 * (s - 10),
                 "sampling__reward_mean_all": lambda s: 0.4, "sampling__accuracy_all": lambda s: 0.35}
    fired, _ = run(stream(20, **kept_only))
    assert first_firing(fired, "reward_hacking") is None


def fired_steps(name: str, lines: list[dict[str, float]]) -> list[int]:
    fired, _ = run(lines)
    return [step for step, metrics in enumerate(fired, start=1) if f"alarm/{name}" in metrics]


def test_reward_hacking_compares_the_last_window_with_the_one_before_not_the_first():
    # Reward 0.4 -> 0.6 and correct 0.35 -> 0.2 from step 6, then flat. Steps 10-13: the rise over the
    # window before is .20/.16/.12/.08, the fall .15/.12/.09/.06; at step 14 the rise .04 is within
    # the 0.05 margin and it clears. Against the first window it would hold to step 20.
    lines = stream(20, reward__mean=lambda s: 0.4 if s <= 5 else 0.6, reward__correct=lambda s: 0.35 if s <= 5 else 0.2)
    assert fired_steps("reward_hacking", lines) == [10, 11, 12, 13]


def test_clip_outliers_fires_on_a_ratio_above_its_maximum_and_on_a_nan_ratio():
    assert fired_steps("clip_outliers", stream(4, loss__ratio_max=lambda s: 20.0 if s == 3 else 1.3)) == [3]
    assert fired_steps("clip_outliers", stream(4, loss__ratio_max=lambda s: math.nan if s == 3 else 1.3)) == [3]


def test_kl_blowup_waits_for_one_window_only():
    assert fired_steps("kl_blowup", stream(8, kl__mean=lambda s: 2.0)) == [5, 6, 7, 8]


def test_grad_norm_s_baseline_is_the_median_of_every_step_before():
    # 0.05 for steps 1-5, then 1.0: the median of the earlier steps stays 0.05 through step 14 and is
    # 0.525 at step 15 (1.0 is then within its factor). A first-window baseline would fire to step 20.
    lines = stream(20, train__grad_norm=lambda s: 0.05 if s <= 5 else 1.0)
    assert fired_steps("grad_norm", lines) == [10, 11, 12, 13, 14]


def test_a_non_finite_gradient_norm_fires_at_once():
    fired, warnings = run(stream(3, train__grad_norm=lambda s: math.inf if s == 3 else 1.0))
    assert first_firing(fired, "grad_norm") == 3 and "train/grad_norm is inf" in warnings[0]
    fired, _ = run(stream(20, train__grad_norm=lambda s: 40.0 if s == 12 else 1.0))
    assert fired == [{}] * 20  # a single spike (clipped anyway) is not an alarm


def test_an_alarm_that_clears_and_returns_warns_again():
    fired, warnings = run(stream(14, loss__clip_frac=lambda s: 0.6 if s in (3, 4, 10) else 0.01))
    assert [step for step, metrics in enumerate(fired, start=1) if metrics] == [3, 4, 10]
    assert len(warnings) == 2
    assert "alarm clip_outliers at step 3:" in warnings[0] and "alarm clip_outliers at step 10:" in warnings[1]


def test_stop_on_makes_an_alarm_fatal_with_its_numbers():
    changes, step, words = SCRIPTS["kl_blowup"]
    with pytest.raises(AlarmError, match=rf"alarm kl_blowup at step {step}: {words}.*run.stop_on"):
        run(stream(20, **changes), stop_on=("kl_blowup",))
    fired, _ = run(stream(20, **changes), stop_on=("grad_norm",))  # another alarm's name: a warning only
    assert first_firing(fired, "kl_blowup") == step
    with pytest.raises(ValueError, match="unknown alarms"):
        AlarmMonitor(stop_on=("kl",))


def test_the_monitor_resumes_with_its_history():
    changes, step, _ = SCRIPTS["entropy_collapse"]
    lines = stream(20, **changes)
    first = AlarmMonitor(warn=lambda line: None)
    for s, line in enumerate(lines[:12], start=1):
        first.observe(s, line)
    resumed = AlarmMonitor(warn=lambda line: None)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    fired = [resumed.observe(s, line) for s, line in enumerate(lines[12:], start=13)]
    assert first_firing(fired, "entropy_collapse") == step - 12


def test_every_alarm_the_config_names_has_a_check():
    # run.stop_on is checked against the config's names; the monitor runs the checks of the same names.
    assert tuple(ALARMS) == ALARM_NAMES
