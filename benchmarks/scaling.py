"""How the cost of a GRPO step grows: seconds per step against the group size G, the completion
length limit and the number of problems per step, one knob at a time around the defaults.

The policy is frozen (lr = 0) so that completion lengths do not drift between settings; the
table reports the median over the measured steps (the first step is warm-up) and the generated
tokens per step, since decoding cost follows what the model actually writes, not the limit.
Writes benchmarks/results/scaling.json and prints a Markdown table.

    python -m benchmarks.scaling [--quick] [--steps 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from benchmarks.common import machine, write_report
from reasonrl import load_config, train
from reasonrl.training.logging import read_metrics

SWEEPS = {
    "rollout.group_size": [4, 8, 16],
    "rollout.max_new_tokens": [32, 64, 128],
    "rollout.prompts_per_step": [1, 2, 4, 8],
}


def measure(override: str, steps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = load_config(overrides=[f"run.dir={run_dir}/run", f"train.steps={steps}", "train.lr=0", "eval.problems=0",
                                     "run.progress=false", "run.tensorboard=false", "run.log_every=0", override])
        train(cfg)
        measured = [m for m in read_metrics(f"{run_dir}/run") if "perf/step_s" in m][1:]
    return {
        "step_s": statistics.median(m["perf/step_s"] for m in measured),
        "generate_s": statistics.median(m["perf/generate_s"] for m in measured),
        "update_s": statistics.median(m["perf/update_s"] for m in measured),
        "generated_tokens_per_step": statistics.mean(
            m["rollout/len_mean"] * cfg.rollout.group_size * cfg.rollout.prompts_per_step for m in measured),
    }


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two steps per setting, the smaller settings only")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    sweeps = {k: v[:2] for k, v in SWEEPS.items()} if args.quick else SWEEPS
    steps = 2 if args.quick else args.steps
    rows = []
    for knob, values in sweeps.items():
        for value in values:
            result = measure(f"{knob}={value}", steps)
            rows.append({"knob": knob, "value": value, **result})
            print(f"{knob}={value}: {result['step_s']:.1f} s/step", flush=True)
    table = ["| knob | value | s/step | generate s | update s | generated tokens/step |", "|---|---|---|---|---|---|"]
    table += [f"| {r['knob']} | {r['value']} | {r['step_s']:.1f} | {r['generate_s']:.1f} | {r['update_s']:.1f} | "
              f"{r['generated_tokens_per_step']:.0f} |" for r in rows]
    report = {"defaults": "4 problems x 8 samples, 64 new tokens, bf16, SmolLM2-135M-Instruct", "steps": steps,
              "rows": rows, "markdown": "\n".join(table), "machine": machine()}
    write_report("scaling", report)
    print(report["markdown"])
    return report


if __name__ == "__main__":
    main()
