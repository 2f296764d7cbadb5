"""`reasonrl report RUN_DIR`: the HTML report of a run; `reasonrl report RUN_A RUN_B ...`: the page
comparing runs (reasonrl.report writes both)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reasonrl.report import RunDirError, write_report
from reasonrl.report.compare import write_comparison


def add_report_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "report", help="write an HTML report of a run (curves, evaluations, a rollout viewer), or compare runs",
        description="With one RUN_DIR: write RUN_DIR/report.html (self-contained: open it in a browser) and the "
                    "plots as RUN_DIR/plots/*.png. With several: write a page comparing them (their recipes and "
                    "overrides, the settings that differ, the curves overlaid, the evaluations side by side), "
                    "comparison.html by default, and its plots beside it.")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="the directory a training run wrote (its run.dir); several to compare them")
    parser.add_argument("--out", default=None, help="the HTML file to write (default RUN_DIR/report.html, or "
                                                    "comparison.html for several runs)")
    parser.add_argument("--rollout-steps", type=int, default=20,
                        help="embed the rollouts of the last N steps (default 20; 0: all)")
    parser.add_argument("--eval", action="append", default=[], metavar="EVAL_OUT",
                        help="a `reasonrl eval --out` directory whose test-time scaling curves to plot (repeatable)")
    parser.add_argument("--rollout-mb", type=float, default=30.0,
                        help="at most this many MB of rollout text; older steps are left out first (default 30)")


def run_report_command(args: argparse.Namespace) -> int:
    several = len(args.run_dirs) > 1
    if several and args.eval:
        print("reasonrl report: --eval adds to one run's report; give one RUN_DIR", file=sys.stderr)
        return 2
    try:
        if several:
            path = write_comparison(args.run_dirs, args.out or "comparison.html")
        else:
            path = write_report(args.run_dirs[0], args.out, rollout_steps=args.rollout_steps,
                                rollout_megabytes=args.rollout_mb, eval_dirs=args.eval)
    except RunDirError as exc:
        print(f"reasonrl report: {exc}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    print(f"plots: {path.with_name(f'{path.stem}_plots') if several else Path(args.run_dirs[0]) / 'plots'}")
    return 0
