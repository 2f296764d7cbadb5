"""Alarms: signs in a run's metrics that it has gone wrong while still looking normal, each checked
after every step (run.alarms) against a threshold knob of [alarm]:

- entropy_collapse: the policy's entropy (entropy/mean, over the last alarm.window steps) fell
  below alarm.entropy_ratio of its first window's: sampling has stopped exploring;
- reward_hacking: over the last window the total reward (reward/mean) rose by more than
  alarm.hacking_margin while correctness (reward/correct) fell by more than it: a secondary
  reward (format, length, a judge, agreement) is being gamed; with dynamic sampling, whose kept
  groups are chosen by their correctness, the same over every completion sampled
  (sampling/reward_mean_all, sampling/accuracy_all);
- length_explosion: the mean completion length grew beyond alarm.length_factor times its first
  window's;
- truncation_surge: the share of completions cut at the token limit rose by more than
  alarm.truncation_rise over its first window's;
- clip_outliers: a step clipped more than alarm.clip_frac_max of its tokens, or had an importance
  ratio above alarm.ratio_max (the samples are far off-policy);
- kl_blowup: the KL to the reference (kl/mean, over the last window) went above alarm.kl_max;
- no_gradient: over the last window more than alarm.zero_std_max of the groups had one reward for
  all their samples (no advantage, no gradient: the batch is not learning); with dynamic sampling,
  whose kept groups all have spread, the share of the sampled groups it dropped
  (sampling/dropped_frac); with overlong filtering (sampling.mask_truncated), also when more than
  that share of the completions were cut at the token limit (rollout/truncated_frac), as those get
  no loss;
- grad_norm: the gradient norm is not finite, or its median over the last window is above
  alarm.grad_norm_factor times its median over the steps before (a single spike, clipped anyway,
  is not an alarm).

An alarm that fires prints a warning with the step and the numbers (once, until it clears), logs
`alarm/<name>` = 1 at every step it holds, and shows as a marker in `reasonrl report`;
run.stop_on=<names> makes it stop the run instead. Windowed alarms wait for full windows (two
when they compare with an earlier one). The thresholds are the [alarm] section itself (AlarmConfig),
its defaults the only ones; reasonrl.config.knobs.ALARMS names the checks.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from reasonrl.config.sections import AlarmConfig
from reasonrl.sampling.dynamic import ACCURACY_ALL, DROPPED_FRAC, DROPPED_GRADED_FRAC, REWARD_MEAN_ALL
from reasonrl.types import CORRECT

# Logged at every step when overlong filtering (sampling.mask_truncated) is on: the cut-off completions
# given no loss (reasonrl.training.estimation).
MASKED_TRUNCATED = "sampling/masked_truncated"


class AlarmError(RuntimeError):
    """An alarm named in run.stop_on fired."""


@dataclass
class History:
    """Each metric's values, in step order (a step that did not log a metric adds nothing to it)."""

    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, metrics: Mapping[str, float]) -> None:
        for key, value in metrics.items():
            self.values.setdefault(key, []).append(float(value))

    def windows(self, key: str, size: int) -> tuple[float, float, float] | None:
        """(mean of the first `size` values, of the `size` before the last `size`, of the last `size`),
        or None before there are 2 * size values."""
        line = self.values.get(key, [])
        if len(line) < 2 * size:
            return None
        return _mean(line[:size]), _mean(line[-2 * size : -size]), _mean(line[-size:])

    def last(self, key: str) -> float | None:
        line = self.values.get(key)
        return line[-1] if line else None


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


Check = Callable[[History, AlarmConfig], "str | None"]
"""An alarm: the numbers that make it fire (for the warning), or None when it holds not."""


def entropy_collapse(h: History, t: AlarmConfig) -> str | None:
    w = h.windows("entropy/mean", t.window)
    if w is not None and w[2] < t.entropy_ratio * w[0]:
        return (f"entropy/mean {w[2]:.4g} (mean of the last {t.window} steps) is below alarm.entropy_ratio="
                f"{t.entropy_ratio:g} x its first {t.window} steps' {w[0]:.4g}")
    return None


def reward_hacking(h: History, t: AlarmConfig) -> str | None:
    # Under dynamic sampling the kept groups' correctness is fixed by the keep rule (1..G-1 correct),
    # so the policy's own trend is in the numbers over every completion sampled.
    total_key, correct_key = ((REWARD_MEAN_ALL, ACCURACY_ALL) if ACCURACY_ALL in h.values
                              else ("reward/mean", f"reward/{CORRECT}"))
    total, correct = h.windows(total_key, t.window), h.windows(correct_key, t.window)
    if total is None or correct is None:
        return None
    rise, fall = total[2] - total[1], correct[1] - correct[2]
    if rise > t.hacking_margin and fall > t.hacking_margin:
        return (f"{total_key} rose {total[1]:.4g} -> {total[2]:.4g} while {correct_key} fell {correct[1]:.4g} -> "
                f"{correct[2]:.4g} (means of the last two {t.window}-step windows; alarm.hacking_margin="
                f"{t.hacking_margin:g}): another reward component is being gamed")
    return None


def length_explosion(h: History, t: AlarmConfig) -> str | None:
    w = h.windows("rollout/len_mean", t.window)
    if w is not None and w[2] > t.length_factor * w[0]:
        return (f"rollout/len_mean {w[2]:.4g} (mean of the last {t.window} steps) is above alarm.length_factor="
                f"{t.length_factor:g} x its first {t.window} steps' {w[0]:.4g}")
    return None


def truncation_surge(h: History, t: AlarmConfig) -> str | None:
    w = h.windows("rollout/truncated_frac", t.window)
    if w is not None and w[2] > w[0] + t.truncation_rise:
        return (f"rollout/truncated_frac {w[2]:.4g} (mean of the last {t.window} steps) is more than "
                f"alarm.truncation_rise={t.truncation_rise:g} above its first {t.window} steps' {w[0]:.4g}")
    return None


def clip_outliers(h: History, t: AlarmConfig) -> str | None:
    clip, ratio = h.last("loss/clip_frac"), h.last("loss/ratio_max")
    if clip is not None and clip > t.clip_frac_max:
        return f"loss/clip_frac {clip:.4g} is above alarm.clip_frac_max={t.clip_frac_max:g}"
    if ratio is not None and not ratio <= t.ratio_max:
        return f"loss/ratio_max {ratio:.4g} is above alarm.ratio_max={t.ratio_max:g}"
    return None


def kl_blowup(h: History, t: AlarmConfig) -> str | None:
    line = h.values.get("kl/mean", [])
    if len(line) < t.window:
        return None
    kl = _mean(line[-t.window:])
    if not kl <= t.kl_max:
        return f"kl/mean {kl:.4g} (mean of the last {t.window} steps) is above alarm.kl_max={t.kl_max:g}"
    return None


def no_gradient(h: History, t: AlarmConfig) -> str | None:
    key = DROPPED_FRAC if DROPPED_FRAC in h.values else "rollout/zero_std_frac"
    w = h.windows(key, t.window)
    if w is not None and w[2] > t.zero_std_max:
        head = f"{key} {w[2]:.4g} (mean of the last {t.window} steps) is above alarm.zero_std_max={t.zero_std_max:g}: "
        if key == DROPPED_FRAC:
            graded = h.windows(DROPPED_GRADED_FRAC, t.window)
            if graded is not None and graded[2] >= w[2] / 2:
                # Under dynamic_keep=correctness a checker with partial credit loses groups whose scores
                # differ but hold no whole solution: the filter, not the task, starves the step.
                return head + (f"dynamic sampling dropped almost every group it sampled, and in {graded[2]:.3g} of the "
                               "sampled groups the checker's scores differed (partial credit, no whole solution): "
                               "sampling.dynamic_keep=reward keeps those groups")
            return head + ("dynamic sampling dropped almost every group it sampled, most of them with one score for "
                           "every answer, so few steps update the policy (problems too easy or too hard)")
        return head + ("almost every group gave all its samples one reward, so there is no advantage to learn from "
                       "(problems too easy or too hard, or a reward that does not discriminate)")
    cut = h.windows("rollout/truncated_frac", t.window) if MASKED_TRUNCATED in h.values else None
    if cut is not None and cut[2] > t.zero_std_max:
        return (f"rollout/truncated_frac {cut[2]:.4g} (mean of the last {t.window} steps) is above alarm.zero_std_max="
                f"{t.zero_std_max:g} and sampling.mask_truncated gives cut-off completions no loss, so almost "
                "nothing is learned from: raise rollout.max_new_tokens or set sampling.mask_truncated=false")
    return None


def grad_norm(h: History, t: AlarmConfig) -> str | None:
    line = h.values.get("train/grad_norm", [])
    if line and not math.isfinite(line[-1]):
        return f"train/grad_norm is {line[-1]}"
    if len(line) < 2 * t.window:
        return None
    recent, before = statistics.median(line[-t.window:]), statistics.median(line[:-t.window])
    if recent > t.grad_norm_factor * before:
        return (f"train/grad_norm {recent:.4g} (median of the last {t.window} steps) is above alarm.grad_norm_factor="
                f"{t.grad_norm_factor:g} x its median over the steps before ({before:.4g})")
    return None


ALARMS: dict[str, Check] = {
    "entropy_collapse": entropy_collapse, "reward_hacking": reward_hacking, "length_explosion": length_explosion,
    "truncation_surge": truncation_surge, "clip_outliers": clip_outliers, "kl_blowup": kl_blowup,
    "no_gradient": no_gradient, "grad_norm": grad_norm}


class AlarmMonitor:
    """Checks every alarm after each step's metrics; warns at an alarm's onset, raises AlarmError for
    one in `stop_on`. `warn` prints a line (default: to stderr, past the progress bar)."""

    def __init__(self, thresholds: AlarmConfig | None = None, *, stop_on: Sequence[str] = (),
                 warn: Callable[[str], None] | None = None):
        unknown = sorted(set(stop_on) - set(ALARMS))
        if unknown:
            raise ValueError(f"unknown alarms {unknown}; alarms: {', '.join(ALARMS)}")
        self.thresholds, self.stop_on = thresholds or AlarmConfig(), frozenset(stop_on)
        self.warn = warn or (lambda line: tqdm.write(line, file=sys.stderr))
        self.history = History()
        self.active: set[str] = set()

    def observe(self, step: int, metrics: Mapping[str, float]) -> dict[str, float]:
        """The alarm/<name> metrics of the alarms that hold after `step`'s `metrics`."""
        self.history.add(metrics)
        fired = {name: detail for name, check in ALARMS.items() if (detail := check(self.history, self.thresholds))}
        for name, detail in fired.items():
            message = f"alarm {name} at step {step}: {detail}"
            if name in self.stop_on:
                raise AlarmError(f"{message}. Stopping: run.stop_on names {name} (docs/troubleshooting.md)")
            if name not in self.active:
                self.warn(f"warning: {message} (docs/troubleshooting.md)")
        self.active = set(fired)
        return {f"alarm/{name}": 1.0 for name in fired}

    def state_dict(self) -> dict[str, Any]:
        return {"values": self.history.values, "active": sorted(self.active)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.history = History({key: list(values) for key, values in state["values"].items()})
        self.active = set(state["active"])
