"""Learning-rate choice for the recipes that take several optimizer steps per rollout batch.

Each (recipe, lr) trains once on the arithmetic task with a seed that no other benchmark uses
(100), so that the recipes' settings are not tuned on the runs that judge them
(benchmarks/recipes.py runs seeds 0-2). Held-out accuracy as in benchmarks/recipes.py. Writes
benchmarks/results/tuning.json; the recipes' comments cite the outcome.

    python -m benchmarks.tune [--recipes gspo,cispo] [--lrs 5e-6,1e-5] [--seed 100] [--steps 20]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from benchmarks.common import machine, write_report
from benchmarks.recipes import ACCURACY, EVAL, before_spec
from benchmarks.runs import train_run

MULTI_STEP_RECIPES = ("gspo", "cispo", "clip_cov", "kl_cov", "ppo")


def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", default=",".join(MULTI_STEP_RECIPES))
    parser.add_argument("--lrs", default="5e-6,1e-5")
    parser.add_argument("--seed", type=int, default=100)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    table: dict[str, dict[str, Any]] = {}
    for recipe in args.recipes.split(","):
        table[recipe] = {}
        for lr in args.lrs.split(","):
            run = train_run("tuning/arithmetic", f"{recipe}_lr{lr}_seed{args.seed}", recipe,
                            [*EVAL, f"run.seed={args.seed}", f"train.steps={args.steps}", f"train.lr={lr}"])
            table[recipe][lr] = {"after": run["eval_last"][ACCURACY], "commit": run["commit"],
                                 "reward_last_5": sum(run["curves"]["reward/mean"][-5:]) / 5,
                                 "entropy_last": run["curves"]["entropy/mean"][-1]}
    report = {"what": "held-out sampled accuracy after training per recipe and lr, one tuning seed",
              "seed": args.seed, "steps": args.steps, "before": before_spec("arithmetic").run()["eval_last"][ACCURACY],
              "machine": machine(), "table": table}
    write_report("tuning", report)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
