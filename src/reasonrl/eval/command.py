"""The `reasonrl eval` command line: arguments, task and engine lookup, then `eval.run.evaluate_tasks`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reasonrl.types import Problem

EVAL_TASKS = ("arithmetic", "humaneval", "gsm8k", "math500", "aime24", "amc23", "minerva_math")


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(part for part in text.split(",") if part)


def add_eval_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "eval", help="evaluate a model on benchmark tasks: pass@k, maj@k, mean@k, test-time scaling curves",
        description="Sample --n completions per problem of each task, check them, and write OUT/results.json and "
                    "OUT/results.md. Completions are cached in OUT: an interrupted run resumes, and a second run "
                    "with other --k or --tts generates nothing new.")
    parser.add_argument("model", help="a hub id or a local model directory (hf engine), or the served model's name "
                                      "(openai engine)")
    parser.add_argument("--task", type=_names, required=True,
                        help=f"comma-separated: {', '.join(EVAL_TASKS)}, or a .jsonl file of question/answer rows")
    parser.add_argument("--n", type=int, default=4, help="completions per problem (default 4)")
    parser.add_argument("--k", type=_ints, default=(1,), help="comma-separated k of pass@k, maj@k, mean@k (default 1)")
    parser.add_argument("--tts", type=_names, default=(),
                        help="test-time scaling methods: majority, weighted_majority, best_of_n, pass")
    parser.add_argument("--budget", type=_ints, default=(), help="sample budgets of the scaling curves (default: --k)")
    parser.add_argument("--limit", type=int, default=0, help="first N problems of each task (0: all)")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine", choices=("hf", "openai"), default="hf")
    parser.add_argument("--url", default="", help="openai engine: the server's base URL, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--out", default="", help="output directory (default: eval/<model name>)")
    parser.add_argument("--no-progress", action="store_true")


def eval_problems(name: str, limit: int) -> list[Problem]:
    """The held-out problems of task `name` (or of a JSONL file), the first `limit` if > 0."""
    from reasonrl.build import build_task
    from reasonrl.config import load_config
    from reasonrl.tasks import BENCHMARKS, Task, benchmark_task

    if name.endswith(".jsonl"):
        problems = list(Task.from_records(name, name).test)
    elif name in BENCHMARKS:
        problems = list(benchmark_task(name, train_size=0).test)
    elif name in EVAL_TASKS:
        overrides = [f"task.name={name}"] + (["reward.verifier=code", "task.test_size=164"] if name == "humaneval" else [])
        problems = list(build_task(load_config(overrides=overrides)).test)
    else:
        raise ValueError(f"unknown eval task {name!r}; known: {', '.join(EVAL_TASKS)}, or a .jsonl file")
    return problems[:limit] if limit > 0 else problems


def run_eval_command(args: argparse.Namespace) -> int:
    from reasonrl.eval.run import EvalSettings, evaluate_tasks
    from reasonrl.rewards import CodeReward, MathReward, RoutedReward, WeightedReward

    try:
        settings = EvalSettings(n=args.n, ks=args.k, temperature=args.temperature, top_p=args.top_p,
                                max_new_tokens=args.max_new_tokens, seed=args.seed, tts=args.tts,
                                budgets=args.budget)
        tasks = {Path(name).stem: eval_problems(name, args.limit) for name in args.task}
    except (ValueError, FileNotFoundError) as exc:
        print(f"reasonrl eval: {exc}", file=sys.stderr)
        return 2
    engine = _engine(args)
    verifier = RoutedReward({"math": MathReward(), "code": CodeReward()}, key="verifier", default="math")
    out = Path(args.out or Path("eval") / Path(args.model).name)
    results = evaluate_tasks(engine, tasks, WeightedReward({"correct": (verifier, 1.0)}), settings, out,
                             model_name=args.model, progress=not args.no_progress)
    print((out / "results.md").read_text())
    print(f"results: {out / 'results.json'}")
    return 0 if results["tasks"] else 1


def _engine(args: argparse.Namespace) -> object:
    if args.engine == "openai":
        from reasonrl.rollout.openai import OpenAIEngine

        if not args.url:
            raise SystemExit("reasonrl eval: --engine openai needs --url http://HOST:PORT/v1")
        return OpenAIEngine(args.url, args.model)
    from reasonrl.models import load_model, load_tokenizer, pick_device, resolve_dtype
    from reasonrl.rollout.hf import HFEngine

    device = pick_device("auto")
    model = load_model(args.model, dtype=resolve_dtype("auto", device), device=device)
    return HFEngine(model, load_tokenizer(args.model))
