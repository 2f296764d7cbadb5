"""The main job (`reasonrl train` on its defaults) for a fixed budget, measured.

Writes benchmarks/results/default_job.json: held-out accuracy before and after training (greedy,
and the mean over `eval.samples` samples at the training temperature), seconds per step,
generated tokens/s, training wall time and peak resident memory. Extra arguments are config
overrides, e.g. `python -m benchmarks.default_job train.steps=20`.

Target (the project's foundation issue): sampled held-out accuracy +15 points absolute within
15 minutes of training on 2 CPU cores.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import machine, peak_rss_mb, write_report
from reasonrl import load_config, train
from reasonrl.training.logging import read_metrics


def main(overrides: list[str]) -> dict:
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    run_dir = out_dir / f"default_job_run_{int(time.time())}"
    cfg = load_config(overrides=[f"run.dir={run_dir}", *overrides])
    started = time.perf_counter()
    result = train(cfg)
    total_s = time.perf_counter() - started
    steps = [m for m in read_metrics(run_dir) if "perf/step_s" in m]
    before, after = result.eval_before or {}, result.eval_after or {}
    report = {
        "config_overrides": overrides,
        "git": subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                              check=False, cwd=Path(__file__).parent).stdout.strip(),
        "steps": len(steps),
        "sequences_per_step": cfg.rollout.prompts_per_step * cfg.rollout.group_size,
        "eval_problems": cfg.eval.problems,
        "eval_samples_per_problem": cfg.eval.samples,
        "sampled_accuracy_before": before.get("eval/sampled_accuracy"),
        "sampled_accuracy_after": after.get("eval/sampled_accuracy"),
        "greedy_accuracy_before": before.get("eval/greedy_accuracy"),
        "greedy_accuracy_after": after.get("eval/greedy_accuracy"),
        "sampled_accuracy_gain_points": 100 * (after.get("eval/sampled_accuracy", 0) - before.get("eval/sampled_accuracy", 0)),
        "training_wall_s": sum(m["perf/step_s"] for m in steps),
        "total_wall_s_incl_eval_and_loading": total_s,
        "step_s_median": statistics.median(m["perf/step_s"] for m in steps),
        "generate_s_median": statistics.median(m["perf/generate_s"] for m in steps),
        "update_s_median": statistics.median(m["perf/update_s"] for m in steps),
        "tokens_per_s_median": statistics.median(m["perf/tokens_per_s"] for m in steps),
        "reward_first_5_steps": statistics.mean(m["reward/mean"] for m in steps[:5]),
        "reward_last_5_steps": statistics.mean(m["reward/mean"] for m in steps[-5:]),
        "peak_rss_mb": peak_rss_mb(),
        "machine": machine(),
        "run_dir": str(run_dir),
    }
    report["target_met"] = (report["sampled_accuracy_gain_points"] >= 15 and report["training_wall_s"] <= 15 * 60)
    write_report("default_job", report)
    return report


if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
    else:
        main(sys.argv[1:])
