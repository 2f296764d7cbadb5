"""The `reasonrl` command: `reasonrl train [CONFIG.toml | RECIPE] [section.key=value ...]`,
`reasonrl distill --teacher MODEL [CONFIG.toml | RECIPE] [section.key=value ...]`, `reasonrl eval MODEL --task ...`,
`reasonrl report RUN_DIR [RUN_DIR ...]`, `reasonrl export CHECKPOINT --out DIR`, `reasonrl inspect RUN_DIR`,
`reasonrl serve MODEL`, `reasonrl sft|dpo|rft ...`, `reasonrl pipeline FILE`, `reasonrl label-steps ...`, `reasonrl prm ...`, `reasonrl recipes` and
`reasonrl explain [CONFIG.toml | RECIPE] [section.key=value ...]`."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

from reasonrl.commands.eval import add_eval_parser, run_eval_command
from reasonrl.commands.export import add_export_parser, run_export_command
from reasonrl.commands.inspect_run import add_inspect_parser, run_inspect_command
from reasonrl.commands.prm import add_prm_parsers, run_label_steps_command, run_prm_command
from reasonrl.commands.report import add_report_parser, run_report_command
from reasonrl.commands.serve import add_serve_parser, run_serve_command
from reasonrl.config import Config, ConfigError, describe_knobs, load_config
from reasonrl.config.explain import explain
from reasonrl.models import ModelNotFoundError
from reasonrl.recipes import config_path, recipes
from reasonrl.stages.pipeline import run_pipeline
from reasonrl.stages.preference import train_dpo
from reasonrl.stages.rft import train_rft
from reasonrl.stages.sft import train_sft
from reasonrl.trainer import train
from reasonrl.training.runs import RUN_START_ERRORS


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return run_serve_command(args)
    if args.command == "pipeline":
        return _pipeline(args.file)
    if args.command == "eval":
        return run_eval_command(args)
    if args.command == "report":
        return run_report_command(args)
    if args.command == "export":
        return run_export_command(args)
    if args.command == "inspect":
        return run_inspect_command(args)
    if args.command == "recipes":
        return _list_recipes()
    if args.command == "explain":
        return _explain(parser, args)
    if args.command == "label-steps":
        return run_label_steps_command(args)
    if args.command == "prm":
        return run_prm_command(args)
    return _train(parser, args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reasonrl", description="RL for language models on verifiable tasks.")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_training_command(
        commands, "train", help="train a policy (no arguments: SmolLM2-135M-Instruct on the arithmetic task, on CPU)",
        description="Train a policy. Settings come from the defaults below, then CONFIG.toml (or the recipe of "
                    "that name, see `reasonrl recipes`), then section.key=value overrides, e.g. "
                    "`reasonrl train dapo train.lr=2e-6` or `reasonrl train my.toml algo.clip_high=0.28`.",
        epilog="`reasonrl explain [CONFIG.toml | RECIPE] [section.key=value ...]` lists the knobs that apply to a "
               "config, with their values and sources.\n\nknobs (section.key, type, default, allowed values):\n"
               + describe_knobs(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    distill = _add_training_command(
        commands, "distill", help="on-policy distillation: the student samples, a teacher scores its tokens",
        description="Train the student (model.name) on the per-token reverse KL to a teacher, scored on the "
                    "student's own samples (docs/distillation.md). The same as `reasonrl train distill "
                    "distill.teacher=TEACHER`: the distill recipe unless CONFIG.toml or another recipe is given "
                    "(then add distill.reward_weight=0 for distillation alone), then section.key=value overrides "
                    "(the knobs of `reasonrl train --help`, e.g. distill.weight, distill.reward_weight).")
    distill.add_argument("--teacher", default="", help="the teacher: a hub id or model directory, http://HOST:PORT/v1 "
                         "(reasonrl serve, vLLM), 'self' or self:step_NNNNNN (sets distill.teacher)")
    _add_training_command(
        commands, "sft", help="supervised fine-tuning on (prompt, solution) data, e.g. a cold start before RL",
        description="Fine-tune on solutions (loss on solution tokens only): task.* names the data (task.name=jsonl "
                    "task.train_path=FILE task.answer_field=solution), train.* the optimizer and steps, sft.* the "
                    "batch. Same config files and overrides as `reasonrl train`.")
    _add_training_command(
        commands, "dpo", help="DPO on preference pairs, or online DPO on the best and worst of sampled groups",
        description="Direct preference optimisation (dpo.*): offline pairs from task.* (task.answer_field = chosen, "
                    "dpo.rejected_field = rejected), or dpo.online=true with the reward.* verifier. Same config "
                    "files and overrides as `reasonrl train`.")
    _add_training_command(
        commands, "rft",
        help="rejection-sampling fine-tuning (expert iteration): sample, keep the verified, fine-tune, repeat",
        description="Rounds (train.steps) of: rft.problems_per_round problems x rollout.group_size samples scored by "
                    "reward.*, the correct ones kept, rft.steps_per_round SFT steps on them.")
    pipeline_parser = commands.add_parser(
        "pipeline", help="run a staged pipeline file (e.g. SFT -> RL); run it again to resume",
        description="Run the [[stage]] tables of a pipeline TOML file in order (kinds sft, rl, dpo, rft), each from "
                    "the previous stage's policy; finished stages are skipped, an interrupted one resumes. See "
                    "docs/pipelines.md.")
    pipeline_parser.add_argument("file", help="the pipeline TOML file")
    commands.add_parser("recipes", help="list the recipes (one per method of the literature)")
    explain = _add_training_command(
        commands, "explain", help="list the knobs that apply to a config or recipe, with values and sources",
        description="The config `reasonrl train` would run with the same arguments: every knob that applies to it, "
                    "section by section, with its value and where it comes from (default, the file or recipe, an "
                    "override). Knobs that do not apply (e.g. algo.sapo_tau_pos under algo.objective=ppo_clip) are "
                    "counted; setting one away from its default is refused.")
    explain.add_argument("--all", action="store_true", help="also list the knobs that do not apply, with why")
    add_eval_parser(commands)
    add_report_parser(commands)
    add_export_parser(commands)
    add_inspect_parser(commands)
    add_prm_parsers(commands)
    add_serve_parser(commands)
    return parser


def _add_training_command(commands: argparse._SubParsersAction, name: str,
                          **kwargs: object) -> argparse.ArgumentParser:
    """A command that takes a config: `reasonrl NAME [CONFIG.toml | RECIPE] [section.key=value ...]`."""
    parser = commands.add_parser(name, **kwargs)
    parser.add_argument("args", nargs="*", metavar="CONFIG.toml | RECIPE | section.key=value")
    return parser


def _config_arguments(parser: argparse.ArgumentParser, arguments: list[str]) -> tuple[list[str], list[str]]:
    """The config files (or recipe names) and the section.key=value overrides among `arguments`; an
    override missing its `=value` (section.key) is named as such, not taken for a second config file.
    A bare name is a recipe, also where a section has that name (the `prime` and `distill` recipes)."""
    sections = {section.name for section in dataclasses.fields(Config)}
    if valueless := [a for a in arguments if "=" not in a and "." in a and a.partition(".")[0] in sections
                     and "/" not in a and not a.endswith(".toml")]:
        parser.error(f"{valueless[0]} has no value: write {valueless[0]}=VALUE")
    config_files = [a for a in arguments if "=" not in a]
    if len(config_files) > 1:
        parser.error(f"one config file or recipe at most, got {config_files}")
    return config_files, [a for a in arguments if "=" in a]


def _train(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`train`, `distill`, `sft`, `dpo` or `rft` on the config its arguments name."""
    config_files, overrides = _config_arguments(parser, args.args)
    if args.command == "distill":
        config_files = config_files or ["distill"]
        overrides = [f"distill.teacher={args.teacher}"] * bool(args.teacher) + overrides
    try:
        path = config_path(config_files[0]) if config_files else None
        cfg = load_config(path, overrides)
    except (ConfigError, FileNotFoundError) as exc:
        message = str(exc)
        if args.command == "distill" and _complete_but_for_a_teacher(path, overrides):
            message = "distill needs a teacher: --teacher MODEL (or distill.teacher=MODEL)"
        print(f"reasonrl: config error: {message}", file=sys.stderr)
        return 2
    if args.command == "distill" and not cfg.distill.teacher:
        print("reasonrl: distill needs a teacher: --teacher MODEL (or distill.teacher=MODEL)", file=sys.stderr)
        return 2

    if args.command in ("sft", "dpo", "rft"):
        runner = {"sft": train_sft, "dpo": train_dpo, "rft": train_rft}[args.command]
        return _exit_code(lambda: print(f"final checkpoint: {runner(cfg)}"))
    return _exit_code(lambda: train(cfg))


def _exit_code(run: Callable[[], object]) -> int:
    """Run `run`: 0 when it finishes; 2 on a ConfigError (what only the task's problems show, e.g. a
    system message beside model.system_prompt), a missing model or a run that cannot start as asked
    (each message says what to do); 130 on Ctrl-C, whose RunInterrupted says where it stopped and
    how to go on."""
    try:
        run()
    except ConfigError as exc:
        print(f"reasonrl: config error: {exc}", file=sys.stderr)
        return 2
    except (*RUN_START_ERRORS, ModelNotFoundError) as exc:
        print(f"reasonrl: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"\nreasonrl: {exc or 'interrupted'}", file=sys.stderr)
        return 130
    return 0


def _complete_but_for_a_teacher(path: Path | None, overrides: list[str]) -> bool:
    """Whether the config loads once it names a teacher (the distill recipe's knobs need one)."""
    try:
        load_config(path, [*overrides, "distill.teacher=self"])
    except (ConfigError, FileNotFoundError):
        return False
    return True


def _explain(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    config_files, overrides = _config_arguments(parser, args.args)
    try:
        path = config_path(config_files[0]) if config_files else None
        label = "recipe" if config_files and not config_files[0].endswith(".toml") else "file"
        print(explain(path, overrides, file_label=label, everything=args.all))
    except (ConfigError, FileNotFoundError) as exc:
        print(f"reasonrl: config error: {exc}", file=sys.stderr)
        return 2
    return 0


def _pipeline(file: str) -> int:
    return _exit_code(lambda: run_pipeline(file))


def _list_recipes() -> int:
    found = recipes()
    width = max((len(recipe.name) for recipe in found), default=0)
    for recipe in found:
        print(f"{recipe.name:<{width}}  {recipe.summary}")
    if found:
        print(f"\nrun one with `reasonrl train NAME [section.key=value ...]`; files in {found[0].path.parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
