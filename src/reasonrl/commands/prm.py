"""The `reasonrl label-steps` and `reasonrl prm` commands: Monte Carlo step labels for a task's
problems (`stages.prm_labels`), and a process reward model trained on them (`stages.prm`)."""

from __future__ import annotations

import argparse
import codecs
import json
import sys
from pathlib import Path
from typing import Any

from reasonrl.build import build_task
from reasonrl.config import ConfigError, load_config
from reasonrl.models import load_model, load_tokenizer, pick_device, resolve_dtype
from reasonrl.rewards import CodeReward, MathReward, RoutedReward
from reasonrl.rewards.code import default_verifier
from reasonrl.rollout.hf import HFEngine
from reasonrl.stages.prm import PRMSettings, train_prm
from reasonrl.stages.prm_labels import LabelSettings, label_steps
from reasonrl.tasks import BENCHMARKS, Task, benchmark_task
from reasonrl.types import Problem


def add_prm_parsers(commands: argparse._SubParsersAction) -> None:
    label = commands.add_parser(
        "label-steps", help="label the steps of sampled solutions by Monte Carlo rollouts (Math-Shepherd)",
        description="Sample --samples solutions per problem, cut each into steps, and label step i by the share "
                    "(soft) and the existence (hard) of verified answers among --continuations completions from the "
                    "prefix ending at step i. Writes one JSONL line per solution to --out; a re-run skips the "
                    "problems already there. See docs/prm.md.")
    label.add_argument("--model", required=True, help="the policy: a hub id, model directory or checkpoint")
    label.add_argument("--task", required=True, help="a built-in task (its training problems), a benchmark "
                                                     "(its problems) or a .jsonl file of question/answer rows")
    label.add_argument("--out", required=True, help="the labels file (JSONL), appended to when it exists")
    label.add_argument("--samples", type=int, default=4, help="solutions per problem (default 4)")
    label.add_argument("--continuations", type=int, default=8, help="completions per step, K (default 8)")
    label.add_argument("--split", default="lines", choices=("lines", "double_newline", "step_markers"),
                       help="how a solution is cut into steps (as reward.process_split; default lines)")
    label.add_argument("--limit", type=int, default=0, help="first N problems (0: all)")
    label.add_argument("--temperature", type=float, default=0.7)
    label.add_argument("--top-p", type=float, default=1.0)
    label.add_argument("--max-new-tokens", type=int, default=512)
    label.add_argument("--stop", action="append", default=[], help="a stop string (repeatable; escapes such as \\n)")
    label.add_argument("--no-chat-template", action="store_true", help="give the prompt as plain text")
    label.add_argument("--seed", type=int, default=0)
    label.add_argument("--no-progress", action="store_true")

    prm = commands.add_parser(
        "prm", help="train a process reward model on step labels (reward.process_model, eval --prm)",
        description="Fine-tune a causal LM to score each step by P('+') against P('-') at its step tag (or, with "
                    "--form classifier, a token-classification head on it), with binary cross-entropy against the "
                    "step labels of `reasonrl label-steps`, on all but --held-out of the problems; report step "
                    "accuracy and AUC on those before and after; save the PRM to --out.")
    prm.add_argument("--model", required=True, help="the base model: a hub id or model directory")
    prm.add_argument("--labels", required=True, help="the labels file written by `reasonrl label-steps`")
    prm.add_argument("--out", required=True, help="the directory to save the PRM to")
    prm.add_argument("--label", default="soft", choices=("soft", "hard"), help="train on soft or hard labels")
    prm.add_argument("--form", default="generative", choices=("generative", "classifier"),
                     help="generative: '+'/'-' tokens of the LM (Math-Shepherd); classifier: a 2-label token "
                          "classification head read at the step tags")
    prm.add_argument("--steps", type=int, default=200, help="optimizer steps (default 200)")
    prm.add_argument("--batch-size", type=int, default=8, help="solutions per step (default 8)")
    prm.add_argument("--lr", type=float, default=1e-5)
    prm.add_argument("--held-out", type=float, default=0.1, help="share of the problems held out (default 0.1)")
    prm.add_argument("--seed", type=int, default=0)
    prm.add_argument("--device", default="auto", help="auto, cpu, cuda, ...")
    prm.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                     help="compute dtype of the training step (weights stay float32); auto = bfloat16 autocast where "
                          "the hardware has it fast")
    prm.add_argument("--save-every", type=int, default=50,
                     help="checkpoint every N steps in OUT/checkpoints (default 50; 0: never): running the same "
                          "command again resumes from the last one")
    prm.add_argument("--no-progress", action="store_true")


def task_problems(name: str, limit: int) -> list[Problem]:
    """The problems to label: a .jsonl file's rows, a benchmark's training problems (those whose
    prompt is not also a test problem's), an evaluation-only benchmark's test problems (labeling
    one you evaluate on leaks it into the PRM), or a built-in task's training problems."""

    if name.endswith(".jsonl"):
        problems = list(Task.from_records(name, name=Path(name).stem).train)
    elif name in BENCHMARKS and BENCHMARKS[name].has_train:
        problems = list(benchmark_task(name).train)
    elif name in BENCHMARKS:
        problems = list(benchmark_task(name, train_size=0).test)
    else:
        problems = list(build_task(load_config(overrides=[f"task.name={name}"])).train)
    return problems[:limit] if limit > 0 else problems


def run_label_steps_command(args: argparse.Namespace) -> int:

    try:
        settings = LabelSettings(samples=args.samples, continuations=args.continuations, split=args.split,
                                 temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                                 stop=tuple(codecs.decode(s, "unicode_escape") for s in args.stop), seed=args.seed)
        problems = task_problems(args.task, args.limit)
        engine = _engine(args.model, chat_template=not args.no_chat_template)
    except (ValueError, FileNotFoundError, OSError, ConfigError) as exc:
        print(f"reasonrl label-steps: {exc}", file=sys.stderr)
        return 2

    verifier = RoutedReward({"math": MathReward(), "code": CodeReward()}, key="verifier", default=default_verifier)
    out = label_steps(engine, verifier, problems, args.out, settings, progress=not args.no_progress)
    print(f"step labels: {out}")
    return 0


def _engine(model: str, *, chat_template: bool) -> Any:

    device = pick_device("auto")
    return HFEngine(load_model(model, dtype=resolve_dtype("auto", device), device=device), load_tokenizer(model),
                    chat_template=chat_template)


def run_prm_command(args: argparse.Namespace) -> int:

    try:
        device = pick_device(args.device)
    except RuntimeError as exc:
        print(f"reasonrl prm: {exc}", file=sys.stderr)
        return 2
    try:
        settings = PRMSettings(label=args.label, form=args.form, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                               held_out=args.held_out, seed=args.seed, dtype=args.dtype, save_every=args.save_every)
        report = train_prm(args.model, args.labels, args.out, settings, device=device, progress=not args.no_progress)
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"reasonrl prm: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"before": report["before"], "after": report["after"]}, indent=2))
    print(f"PRM saved to {args.out} (reward.process_model={args.out}, reasonrl eval --prm {args.out})")
    return 0


__all__ = ["add_prm_parsers", "run_label_steps_command", "run_prm_command", "task_problems"]
