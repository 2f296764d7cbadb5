"""SFT cold start then GRPO, against GRPO alone, at equal compute on this machine.

Both arms train SmolLM2-135M-Instruct on the arithmetic problems of
examples/data/arithmetic_solutions.jsonl (the same train and held-out split, the same seed).
The first arm runs `reasonrl pipeline` on examples/sft_then_grpo.toml's stages (SFT on the worked
solutions, then GRPO); the second runs GRPO alone for as many more steps as the SFT stage took
in wall-clock time at the first arm's GRPO speed, so both spend the same seconds. Held-out greedy
accuracy is measured before training and after every GRPO chunk.

Writes benchmarks/results/sft_then_grpo.json (accuracy against seconds spent, per arm; the SFT
loss; steps) and benchmarks/results/sft_then_grpo.png.

    python -m benchmarks.sft_then_grpo [--sft-steps 20] [--rl-steps 12] [section.key=value ...]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine, write_report

RESULTS = Path(__file__).parent / "results"
DATA = Path(__file__).parents[1] / "examples" / "data" / "arithmetic_solutions.jsonl"
TASK = ["task.name=jsonl", f"task.train_path={DATA}", "task.test_size=40"]
COMMON = ["run.progress=false", "run.tensorboard=false", "eval.samples=0", "eval.problems=40"]


def metrics_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def grpo(run_dir: Path, steps: int, chunk: int, extra: list[str]) -> tuple[list[dict], float]:
    """GRPO in chunks (held-out eval after each); its metrics and wall seconds."""
    started, done = time.perf_counter(), 0
    while done < steps:
        done = min(done + chunk, steps)
        resume = ["run.resume=true"] if (run_dir / "checkpoints").is_dir() else []
        subprocess.run([sys.executable, "-m", "reasonrl.commands.cli", "train", "grpo", *TASK, *COMMON, f"run.dir={run_dir}",
                        f"train.steps={done}", f"run.save_every={chunk}", *resume, *extra], check=True)
    return metrics_of(run_dir), time.perf_counter() - started


def accuracy_curve(metrics: list[dict], offset_s: float) -> list[dict]:
    """(seconds spent, held-out accuracy) at every evaluation, seconds counted from `offset_s`."""
    curve, spent = [], offset_s
    by_step = {m["step"]: m["perf/step_s"] for m in metrics if "perf/step_s" in m}
    for m in metrics:
        if "eval/greedy_accuracy" in m:
            spent = offset_s + sum(s for step, s in by_step.items() if step <= m["step"])
            curve.append({"step": m["step"], "seconds": spent, "accuracy": m["eval/greedy_accuracy"]})
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft-steps", type=int, default=20)
    parser.add_argument("--rl-steps", type=int, default=12)
    parser.add_argument("--chunk", type=int, default=4, help="GRPO steps between held-out evaluations")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sft_then_grpo_") as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "reasonrl.commands.cli", "sft", *TASK, *COMMON, f"run.dir={root / 'sft'}",
                        "task.answer_field=solution", f"train.steps={args.sft_steps}", "sft.batch_size=8",
                        "train.lr=1e-5", "eval.problems=0", *args.overrides], check=True)
        sft_s = time.perf_counter() - started
        sft_losses = [m["loss/sft"] for m in metrics_of(root / "sft") if "loss/sft" in m]
        policy = root / "sft" / "checkpoints" / f"step_{args.sft_steps:06d}" / "policy"
        after_sft, after_sft_s = grpo(root / "sft_grpo", args.rl_steps, args.chunk,
                                      [f"model.name={policy}", "eval.before=true", *args.overrides])
        rl_step_s = statistics.median(m["perf/step_s"] for m in after_sft if "perf/step_s" in m)
        extra_steps = math.ceil(sft_s / rl_step_s)
        alone, alone_s = grpo(root / "grpo", args.rl_steps + extra_steps, args.chunk,
                              ["eval.before=true", *args.overrides])
    curves = {"sft_then_grpo": accuracy_curve(after_sft, sft_s), "grpo_alone": accuracy_curve(alone, 0.0)}
    curves["sft_then_grpo"].insert(0, {"step": 0, "seconds": 0.0, "accuracy": curves["grpo_alone"][0]["accuracy"]})
    report = {
        "machine": machine(), "task": TASK, "overrides": args.overrides,
        "sft": {"steps": args.sft_steps, "seconds": sft_s, "loss_first": sft_losses[0], "loss_last": sft_losses[-1]},
        "sft_then_grpo": {"rl_steps": args.rl_steps, "rl_seconds": after_sft_s, "curve": curves["sft_then_grpo"]},
        "grpo_alone": {"rl_steps": args.rl_steps + extra_steps, "rl_seconds": alone_s, "curve": curves["grpo_alone"]},
        "equal_compute": f"GRPO alone got {extra_steps} more steps: the SFT stage's {sft_s:.0f} s at "
                         f"{rl_step_s:.1f} s per GRPO step",
    }
    print(f"wrote {write_report('sft_then_grpo', report)}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(figsize=(6, 4))
        for name, curve in curves.items():
            axes.plot([p["seconds"] / 60 for p in curve], [p["accuracy"] for p in curve], marker="o", label=name)
        axes.set(xlabel="minutes of compute (SFT included)", ylabel="held-out greedy accuracy",
                 title="SFT -> GRPO vs GRPO alone")
        axes.grid(alpha=0.3)
        axes.legend()
        figure.tight_layout()
        figure.savefig(RESULTS / "sft_then_grpo.png", dpi=120)
    except ImportError:
        pass
    for name, curve in curves.items():
        print(f"{name:>14}: accuracy {curve[0]['accuracy']:.3f} -> {curve[-1]['accuracy']:.3f} "
              f"in {curve[-1]['seconds'] / 60:.1f} min")


if __name__ == "__main__":
    main()
