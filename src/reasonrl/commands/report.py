"""`reasonrl report RUN_DIR`: the HTML report of a run (reasonrl.report writes it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reasonrl.report import RunDirError, write_report


def add_report_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "report", help="write an HTML report of a run: curves, evaluations, a rollout viewer",
        description="Write RUN_DIR/report.html (self-contained: open it in a browser) and the plots as "
                    "RUN_DIR/plots/*.png.")
    parser.add_argument("run_dir", help="the directory a training run wrote (its run.dir)")
    parser.add_argument("--out", default=None, help="the HTML file to write (default RUN_DIR/report.html)")
    parser.add_argument("--rollout-steps", type=int, default=20,
                        help="embed the rollouts of the last N steps (default 20; 0: all)")
    parser.add_argument("--eval", action="append", default=[], metavar="EVAL_OUT",
                        help="a `reasonrl eval --out` directory whose test-time scaling curves to plot (repeatable)")
    parser.add_argument("--rollout-mb", type=float, default=30.0,
                        help="at most this many MB of rollout text; older steps are left out first (default 30)")


def run_report_command(args: argparse.Namespace) -> int:
    try:
        path = write_report(args.run_dir, args.out, rollout_steps=args.rollout_steps,
                            rollout_megabytes=args.rollout_mb, eval_dirs=args.eval)
    except RunDirError as exc:
        print(f"reasonrl report: {exc}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    print(f"plots: {Path(args.run_dir) / 'plots'}")
    return 0
