"""The two agent examples trained with the default model: does the rate of valid tool calls rise?

Runs `reasonrl train examples/agents/tool_math.toml` and `.../retrieval_qa.toml` (SmolLM2-135M-
Instruct, the examples' own settings, `--steps` steps each) and writes, per step, the valid and
invalid tool calls per model turn, the share of episodes that made at least one valid call (from
rollouts.jsonl), the accuracy of the final answers and the mean episode length; and the held-out
evaluation before and after. Results: benchmarks/results/agents.json and agents.png.

    python -m benchmarks.agents [--steps 30] [--examples tool_math,retrieval_qa] [--reuse RUNS_ROOT]

`--reuse` summarises runs already in RUNS_ROOT/<example> instead of training again.

Over seeds (`--seeds 0,1,2`, `run.seed`): each run is a record, benchmarks/results/agents/EXAMPLE_seedN.json
(its commit, source digest, summary and curve), written when it ends, so a rerun resumes and a seed
recorded is not trained again. The summary, benchmarks/results/agents_seeds.json and .png, gives per
example the held-out sampled accuracy before and after each seed, the median after, and the mean
change after minus before with its 95% Student-t interval over seeds.

    python -m benchmarks.agents --seeds 0,1,2 --examples tool_math
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.common import code_version, interval_verdict, machine, pyplot, source_digest, t_interval, write_report
from reasonrl import load_config, train

EXAMPLES = ("tool_math", "retrieval_qa")
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SEED_RECORDS = RESULTS / "agents"


def train_example(name: str, steps: int, run_dir: Path, seed: int | None = None, threads: int = 0) -> None:
    seeded = ([] if seed is None else [f"run.seed={seed}"]) + ([f"run.threads={threads}"] if threads else [])
    cfg = load_config(ROOT / "examples" / "agents" / f"{name}.toml",
                      overrides=[f"train.steps={steps}", f"run.dir={run_dir}", "eval.every=0", "run.log_every=5",
                                 *seeded])
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
    if (plt := pyplot()) is None:
        return
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


def seed_record(name: str, seed: int, steps: int, runs_root: Path, threads: int = 0) -> dict:
    """The record of `name` trained with `seed` for `steps` steps: read when it exists, else trained
    (in RUNS_ROOT/NAME/seedN) and written."""
    path = SEED_RECORDS / f"{name}_seed{seed}.json"
    if path.exists():
        record = json.loads(path.read_text())
        if record["steps"] == steps:
            return record
    run_dir = runs_root / name / f"seed{seed}"
    # What runs is what the tree holds now: read before training, as the tree may change meanwhile.
    commit, source = code_version(), source_digest()
    train_example(name, steps, run_dir, seed, threads)
    record = {"example": name, "seed": seed, **summarise(run_dir), "threads": threads or "default",
              "commit": commit, "source": source, "machine": machine()}
    SEED_RECORDS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return record


def over_seeds(records: list[dict]) -> dict:
    """Held-out sampled accuracy before and after each seed, in points; the change's mean and 95%
    interval over seeds, and whether that interval lies above 0."""
    before = [100 * r["eval"]["before"]["sampled_accuracy"] for r in records]
    after = [100 * r["eval"]["after"]["sampled_accuracy"] for r in records]
    change = [a - b for a, b in zip(after, before, strict=True)]
    mean, low, high = t_interval(change)
    return {"seeds": [r["seed"] for r in records], "commits": sorted({r["commit"] for r in records}),
            "sampled_accuracy_before": before, "sampled_accuracy_after": after,
            "greedy_accuracy_after": [100 * r["eval"]["after"]["greedy_accuracy"] for r in records],
            "median_before": statistics.median(before), "median_after": statistics.median(after),
            "change": {"per_seed": change, "median": statistics.median(change), "mean": mean, "ci95": [low, high],
                       "verdict_above_0": interval_verdict(low, high)}}


def plot_seeds(records: dict[str, list[dict]], path: Path) -> None:
    if (plt := pyplot()) is None:
        return
    fig, axes = plt.subplots(1, len(records), figsize=(6 * len(records), 4), squeeze=False)
    for ax, (name, runs) in zip(axes[0], records.items()):
        for key, color in (("episodes_with_valid_call", "tab:blue"), ("accuracy", "tab:green")):
            for i, run in enumerate(runs):
                ax.plot([p["step"] for p in run["curve"]], [p[key] for p in run["curve"]], color=color, alpha=0.6,
                        label=f"{key.replace('_', ' ')} (one line a seed)" if i == 0 else None)
        ax.set(title=f"{name}, seeds {', '.join(str(r['seed']) for r in runs)} (SmolLM2-135M)",
               xlabel="training step", ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--examples", default=",".join(EXAMPLES))
    parser.add_argument("--seeds", help="e.g. 0,1,2: one recorded run per seed and a summary over them "
                        "(agents_seeds.json); without it, one run of each example at its own seed (agents.json)")
    parser.add_argument("--threads", type=int, default=0, help="run.threads of each run (e.g. 1 for two runs side by "
                        "side on two cores; default: the run's own)")
    parser.add_argument("--runs-root", type=Path, default=ROOT / "runs" / "agent-benchmark")
    parser.add_argument("--reuse", action="store_true", help="summarise the runs in --runs-root, do not train")
    args = parser.parse_args()
    if args.seeds:
        seeds = [int(seed) for seed in args.seeds.split(",")]
        records = {name: [seed_record(name, seed, args.steps, args.runs_root, args.threads) for seed in seeds]
                   for name in args.examples.split(",")}
        summary = {name: over_seeds(runs) for name, runs in records.items()}
        print(json.dumps(summary, indent=2), flush=True)
        plot_seeds(records, RESULTS / "agents_seeds.png")
        write_report("agents_seeds", {"model": "SmolLM2-135M-Instruct", "steps": args.steps, "examples": summary,
                                      "records": str(SEED_RECORDS.relative_to(ROOT)), "machine": machine()})
        return summary
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
