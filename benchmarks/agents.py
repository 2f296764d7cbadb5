"""The two agent examples trained with the default model: does the rate of valid tool calls rise?

Runs `reasonrl train examples/agents/tool_math.toml` and `.../retrieval_qa.toml` (SmolLM2-135M-
Instruct, the examples' own settings, `--steps` steps each) and writes, per step, the valid and
invalid tool calls per model turn, the share of episodes that made at least one valid call (from
rollouts.jsonl), the accuracy of the final answers and the mean episode length; and the held-out
evaluation before and after. Results: benchmarks/results/agents.json and agents.png.

    python -m benchmarks.agents [--steps 30] [--examples tool_math,retrieval_qa] [--reuse RUNS_ROOT]

`--reuse` summarises runs already in RUNS_ROOT/<example> instead of training again.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.common import machine, write_report
from reasonrl import load_config, train

EXAMPLES = ("tool_math", "retrieval_qa")
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def train_example(name: str, steps: int, run_dir: Path) -> None:
    cfg = load_config(ROOT / "examples" / "agents" / f"{name}.toml",
                      overrides=[f"train.steps={steps}", f"run.dir={run_dir}", "eval.every=0", "run.log_every=5"])
    train(cfg)


def summarise(run_dir: Path) -> dict:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "reward/tool/valid" in m]
    evals = [m for m in lines if any(k.startswith("eval/") for k in m)]
    episodes: dict[int, list[bool]] = {}
    for line in (run_dir / "rollouts.jsonl").read_text().splitlines():
        record = json.loads(line)
        episodes.setdefault(record["step"], []).append(record["components"].get("tool/valid", 0.0) > 0)
    curve = [{"step": m["step"], "valid_per_turn": round(m["reward/tool/valid"], 3),
              "invalid_per_turn": round(m["reward/tool/invalid"], 3),
              "episodes_with_valid_call": round(sum(episodes[m["step"]]) / len(episodes[m["step"]]), 3),
              "accuracy": round(m["reward/correct"], 3), "len_mean": round(m["rollout/len_mean"], 1),
              "step_s": round(m["perf/step_s"], 1)} for m in steps]

    def window(key: str, part: slice) -> float:
        return round(statistics.fmean(point[key] for point in curve[part]), 3)

    first, last = slice(0, 5), slice(-5, None)
    summary = {key: {"first_5_steps": window(key, first), "last_5_steps": window(key, last)}
               for key in ("valid_per_turn", "episodes_with_valid_call", "invalid_per_turn", "accuracy")}
    evaluation = {}
    for tag, m in (("before", evals[0]), ("after", evals[-1])) if len(evals) >= 2 else ():
        evaluation[tag] = {k.removeprefix("eval/"): round(v, 3) for k, v in m.items()
                           if k.startswith("eval/") and ("accuracy" in k or "tool/" in k)}
    return {"steps": len(curve), "summary": summary, "eval": evaluation, "curve": curve}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, (name, result) in zip(axes[0], results.items()):
        steps = [p["step"] for p in result["curve"]]
        for key, label in (("episodes_with_valid_call", "episodes with a valid tool call"),
                           ("invalid_per_turn", "invalid calls per turn"), ("accuracy", "answer accuracy")):
            ax.plot(steps, [p[key] for p in result["curve"]], marker=".", label=label)
        ax.set(title=f"{name} (SmolLM2-135M)", xlabel="training step", ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)
        ax.legend(loc="center right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--examples", default=",".join(EXAMPLES))
    parser.add_argument("--runs-root", type=Path, default=ROOT / "runs" / "agent-benchmark")
    parser.add_argument("--reuse", action="store_true", help="summarise the runs in --runs-root, do not train")
    args = parser.parse_args()
    results = {}
    for name in args.examples.split(","):
        run_dir = args.runs_root / name
        if not args.reuse:
            train_example(name, args.steps, run_dir)
        results[name] = summarise(run_dir)
        print(name, json.dumps(results[name]["summary"]), flush=True)
    plot(results, RESULTS / "agents.png")
    report = {"model": "SmolLM2-135M-Instruct", "examples": results,
              "note": ("one seed per example; valid/invalid calls are per model turn (an episode that calls a tool "
                       "once and then answers has 0.5 valid per turn); evaluation on the examples' held-out "
                       "problems, sampled and greedy"),
              "machine": machine()}
    write_report("agents", report)
    return report


if __name__ == "__main__":
    main()
