"""The `reasonrl eval` command line: arguments, task, engine, scorer and PRM lookup, then `eval.run.evaluate_tasks`.

With `--config` (a training config file or recipe) the evaluation plays what that config trains, as
the in-training evaluation does: its `agent.*` environment (multi-turn tool use, each completion an
episode scored as it is played), its task when `--task` is not given, scored by the reward it trains
with (a reasoning-gym task by the environment's own checker, a reward.custom included), its
`task.prompt_template` and system message (`model.system_prompt`, `model.reasoning_format`; for
`--task` problems too), `model.chat_template`, `rollout.stop`, `rollout.temperature`, `rollout.top_p`,
`rollout.top_k` and `rollout.max_new_tokens` (unless given on the command line), `eval.problems` as
the `--limit` of its own task (unless given), and its
engine settings (`rollout.dtype`, `rollout.fused`, `run.device`; `rollout.engine=openai` samples from the
server at `rollout.openai_url`, as `--engine openai --url` does). Without it a benchmark's prompt is
its bare question and math-verify (or a code problem's tests) its checker."""

from __future__ import annotations

import argparse
import codecs
import copy
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.build import build_agent_engine, build_task, build_weighted_reward, system_message, with_system_message
from reasonrl.config import ConfigError, load_config
from reasonrl.eval.identity import ModelIdentity, local_source, model_source, served_source
from reasonrl.eval.run import (
    EvalOutputError,
    EvalSettings,
    Scoring,
    check_output_dir,
    evaluate_tasks,
    mean_logprob_scores,
    verifier_scores,
)
from reasonrl.eval.search import TextContinuation, TokenContinuation, chat_prompt
from reasonrl.models import load_model, load_tokenizer, pick_device, resolve_dtype
from reasonrl.recipes import config_path
from reasonrl.rewards import CodeReward, MathReward, RoutedReward, WeightedReward
from reasonrl.rewards.code import default_verifier
from reasonrl.rewards.judge import ClassifierReward
from reasonrl.rewards.prm import load_process_model
from reasonrl.rewards.process import ProcessReward
from reasonrl.rollout.hf import HFEngine
from reasonrl.rollout.openai import OpenAIEngine
from reasonrl.tasks import BENCHMARKS, Task, benchmark_task
from reasonrl.types import Group, Problem

EVAL_TASKS = ("arithmetic", "humaneval", "gsm8k", "math500", "aime24", "amc23", "minerva_math")
DEFAULT_TEMPERATURE = 0.7  # without --config
DEFAULT_MAX_NEW_TOKENS = 512  # without --config


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
    parser.add_argument("model", help="a hub id, a local model directory or a training checkpoint "
                                      "(RUN/checkpoints/step_N) for the hf engine; the served model's name for the "
                                      "openai engine")
    parser.add_argument("--task", type=_names, default=(),
                        help=f"comma-separated: {', '.join(EVAL_TASKS)}, or a .jsonl file of question/answer rows "
                             "(default with --config: the config's task)")
    parser.add_argument("--config", default="",
                        help="a training config file or recipe name whose settings the evaluation plays, as the "
                             "in-training evaluation does: its task (when --task is not given) scored by its reward "
                             "(reward.*; a reasoning-gym task by the environment's checker), task.prompt_template "
                             "and model.system_prompt / reasoning_format (for --task problems too), "
                             "model.chat_template, rollout.stop, rollout.temperature, top_p, top_k and "
                             "max_new_tokens (unless given here), eval.problems as the --limit of its own task "
                             "(unless given), rollout.dtype and rollout.fused; with "
                             "agent.environment set, every completion is an episode of multi-turn tool use, scored "
                             "by the environment (accuracy is the verifier's verdict on the final answer)")
    parser.add_argument("--set", action="append", default=[], metavar="section.key=value",
                        help="override a knob of --config (repeatable), e.g. --set agent.max_turns=2")
    parser.add_argument("--n", type=int, default=4, help="completions per problem (default 4)")
    parser.add_argument("--k", type=_ints, default=(1,), help="comma-separated k of pass@k, maj@k, mean@k (default 1)")
    parser.add_argument("--tts", type=_names, default=(),
                        help="test-time scaling methods: majority, weighted_majority (votes weighted by the "
                             "completion's exp(mean token log-prob)), best_of_n (ranked by --scorer), pass; beam "
                             "(PRM-guided step-level beam search, the PRM's best solution) and beam_majority "
                             "(PRM-weighted majority over its solutions), both with --prm")
    parser.add_argument("--budget", type=_ints, default=(),
                        help="budgets of the scaling curves: samples per problem (at most --n), and for beam the "
                             "number of beams N, e.g. 1,2,4,8,16 (default: --k; beam needs it)")
    parser.add_argument("--scorer", default="logprob",
                        help="what best_of_n ranks by: logprob (mean token log-prob), verifier (the task's "
                             "reward; with a gold-answer checker this is the oracle), prm (the --prm's aggregated "
                             "step scores), or the path of a sequence-classification reward model")
    parser.add_argument("--prm", default="", help="a process reward model directory: a causal LM scoring steps "
                                                  "by its '+'/'-' logits at each step tag, or a token classifier")
    parser.add_argument("--beam-width", type=int, default=4, help="beam search: continuations per kept beam, M "
                                                                  "(N/M beams survive each step; default 4)")
    parser.add_argument("--step-delimiter", default="\\n\\n",
                        help="beam search: where a step ends (escapes such as \\n allowed; default a blank line)")
    parser.add_argument("--prm-aggregate", default="last", choices=("last", "min", "mean", "product"),
                        help="how a solution's step scores become its score (default last, as Snell et al. 2024)")
    parser.add_argument("--max-steps", type=int, default=40, help="beam search: at most this many steps")
    parser.add_argument("--max-step-tokens", type=int, default=256, help="beam search: at most this many tokens a step")
    parser.add_argument("--limit", type=int, default=None,
                        help="first N problems of each task (default 0: all; for the --config's own task its "
                             "eval.problems, the problems the in-training evaluation takes)")
    parser.add_argument("--temperature", type=float, default=None,
                        help=f"sampling temperature (default {DEFAULT_TEMPERATURE}; with --config its "
                             "rollout.temperature)")
    parser.add_argument("--top-p", type=float, default=None,
                        help="nucleus sampling mass (default 1.0; with --config its rollout.top_p)")
    parser.add_argument("--top-k", type=int, default=None,
                        help="sample from the k most likely tokens only (default 0: all; with --config its rollout.top_k)")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help=f"completion length limit (default {DEFAULT_MAX_NEW_TOKENS}; with --config its "
                             "rollout.max_new_tokens)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine", choices=("hf", "openai"), default="hf")
    parser.add_argument("--url", default="", help="openai engine: the server's base URL, e.g. http://127.0.0.1:8000/v1 "
                                                  "(with --config: its rollout.openai_url)")
    parser.add_argument("--out", default="", help="output directory (default: eval/<model name>)")
    parser.add_argument("--no-progress", action="store_true")


def eval_problems(name: str, limit: int, prompt_template: str | None = None) -> list[Problem]:
    """The held-out problems of task `name` (or of a JSONL file), the first `limit` if > 0, each
    prompt made with `prompt_template` (None: the task's own: the bare question for benchmarks and
    JSONL files, the training default for the generated tasks)."""
    from dataclasses import replace


    if name.endswith(".jsonl"):
        problems = list(Task.from_records(name, name, prompt_template=prompt_template or "{prompt}").test)
    elif name in BENCHMARKS:
        problems = list(benchmark_task(name, train_size=0, prompt_template=prompt_template or "{prompt}").test)
    elif name in EVAL_TASKS:
        overrides = [f"task.name={name}"] + (["reward.verifier=code", "task.test_size=164"] if name == "humaneval" else [])
        cfg = load_config(overrides=overrides)
        if prompt_template is not None:
            cfg = replace(cfg, task=replace(cfg.task, prompt_template=prompt_template))
        problems = list(build_task(cfg).test)
    else:
        raise ValueError(f"unknown eval task {name!r}; known: {', '.join(EVAL_TASKS)}, or a .jsonl file")
    return problems[:limit] if limit > 0 else problems


def run_eval_command(args: argparse.Namespace) -> int:

    out = Path(args.out or Path("eval") / Path(args.model).name)
    try:
        cfg = _config(args)
        settings = _settings(args, cfg)
        needs_prm = bool(settings.search_methods) or args.scorer == "prm"
        if needs_prm and not args.prm:
            raise ValueError("--tts beam / beam_majority and --scorer prm need --prm PATH, a process reward model")
        if needs_prm and _served(args, cfg):
            raise ValueError("beam search and --scorer prm run with --engine hf (the search needs the token ids)")
        if cfg is not None and cfg.agent.environment and (needs_prm or args.engine == "openai"):
            raise ValueError("an agent config (agent.environment) is evaluated with --engine hf (episodes continue "
                             "from token ids) and without beam search or --scorer prm")
        if not args.task and cfg is None:
            raise ValueError("name the tasks to evaluate with --task (or give --config, whose task is then used)")
        tasks = _tasks(args, cfg)
        check_output_dir(out)
        prm = load_prm(args.prm) if needs_prm else None
        score_fn = best_of_n_scorer(args.scorer, prm, settings)
        loaded = _engine(args, cfg)
        scoring = _scoring(args, cfg, list(tasks), loaded)
    except (ValueError, FileNotFoundError, OSError, ConfigError) as exc:
        print(f"reasonrl eval: {exc}", file=sys.stderr)
        return 2
    step_generator = _step_generator(loaded.engine, loaded.tokenizer) if settings.search_methods else None
    try:
        results = evaluate_tasks(loaded.engine, tasks, scoring, settings, out, model=loaded.identity,
                                 score_fn=score_fn, prm=prm, step_generator=step_generator,
                                 progress=not args.no_progress)
    except EvalOutputError as exc:
        print(f"reasonrl eval: {exc}", file=sys.stderr)
        return 2
    print((out / "results.md").read_text())
    print(f"results: {out / 'results.json'}")
    return 0 if results["tasks"] else 1


def _settings(args: argparse.Namespace, cfg: Any) -> EvalSettings:
    """The evaluation's settings: the command line's, where not given there the --config's
    generation settings (rollout.temperature, top_p, top_k, max_new_tokens and stop, as the
    in-training evaluation samples), else the defaults."""

    rollout = cfg.rollout if cfg is not None else None
    played = ({"temperature": rollout.temperature, "top_p": rollout.top_p, "top_k": rollout.top_k,
               "max_new_tokens": rollout.max_new_tokens} if rollout is not None else
              {"temperature": DEFAULT_TEMPERATURE, "top_p": 1.0, "top_k": 0, "max_new_tokens": DEFAULT_MAX_NEW_TOKENS})
    given = {name: getattr(args, name) for name in played if getattr(args, name) is not None}
    return EvalSettings(n=args.n, ks=args.k, seed=args.seed, tts=args.tts, budgets=args.budget, **(played | given),
                        scorer=args.scorer, prm=args.prm, beam_width=args.beam_width,
                        step_delimiter=codecs.decode(args.step_delimiter, "unicode_escape"),
                        prm_aggregate=args.prm_aggregate, max_steps=args.max_steps,
                        max_step_tokens=args.max_step_tokens, stop=cfg.rollout.stop if cfg is not None else (),
                        context=_context(cfg))


def _tasks(args: argparse.Namespace, cfg: Any) -> dict[str, list[Problem]]:
    """The problems of each --task (with --config, prompts made with its task.prompt_template and
    opened by its system message), or without --task the held-out problems of the --config's task."""
    if args.task:
        template, system = (cfg.task.prompt_template, system_message(cfg)) if cfg is not None else (None, "")
        return {Path(name).stem: with_system_message(eval_problems(name, args.limit or 0, template), system)
                for name in args.task}

    task = build_task(cfg)
    limit = cfg.eval.problems if args.limit is None else args.limit
    return {task.name: list(task.test)[:limit] if limit > 0 else list(task.test)}


def _scoring(args: argparse.Namespace, cfg: Any, task_names: Sequence[str], loaded: LoadedModel) -> dict[str, Scoring]:
    """How each task is scored: the --config's own task (and every task of an agent config, whose
    episodes the environment scores) by `config_scoring`, a --task by `checker_scoring`."""
    if cfg is not None and (cfg.agent.environment or not args.task):
        scoring = config_scoring(cfg, model=loaded.model, tokenizer=loaded.tokenizer,
                                 prompt_ids_fn=getattr(loaded.engine, "prompt_ids", None))
    else:
        scoring = checker_scoring(cfg.reward.extract if cfg is not None else "auto")
    return dict.fromkeys(task_names, scoring)


def config_scoring(cfg: Any, *, model: Any = None, tokenizer: Any = None,
                   prompt_ids_fn: Callable[[Problem], list[int]] | None = None) -> Scoring:
    """The reward `cfg` trains with, built as training builds it (`build.build_weighted_reward`;
    `model` and `prompt_ids_fn` for the confidence rewards that run the policy, `tokenizer` for a
    process reward): a reasoning-gym task scored by the environment's own checker, a reward.custom
    and the shaping terms included."""

    reward = build_weighted_reward(cfg, policy=model, prompt_ids_fn=prompt_ids_fn, tokenizer=tokenizer)
    return Scoring(reward, _config_checker(cfg))


def checker_scoring(extract: str = "auto") -> Scoring:
    """A benchmark's own checker: math-verify of the answer `extract` finds, against the gold answer,
    or a code problem's unit tests (problems say which in metadata["verifier"])."""

    verifier = RoutedReward({"math": MathReward(extract=extract), "code": CodeReward()}, key="verifier", default=default_verifier)
    return Scoring(WeightedReward({"correct": (verifier, 1.0)}),
                   f"math-verify of the answer found by extract={extract} against the gold answer (a code problem: "
                   "its unit tests)")


def _config_checker(cfg: Any) -> str:
    """What decides "correct" under the reward `cfg` trains with, in words."""
    r = cfg.reward
    if r.fn:
        return f"reward.fn={r.fn} (its 'reward' component; there is no 'correct' one), as in training"
    if cfg.agent.environment:
        return f"the agent environment {cfg.agent.environment}: its verifier's verdict on each episode's final answer"
    if cfg.task.name == "environment" and r.verifier == "math":
        return f"the environment {cfg.task.environment}'s own checker, as in training"
    if r.verifier in ("math", "majority_vote"):
        return f"math-verify of the answer found by reward.extract={r.extract} against the gold answer, as in training"
    return f"reward.verifier={r.verifier}, as in training"


def load_prm(path: str) -> Any:
    """A process reward model from a directory (`reasonrl.rewards.prm.load_process_model`)."""

    if not Path(path).is_dir():
        raise FileNotFoundError(f"--prm {path!r} is not a model directory; give the local path of a process reward "
                                "model")
    return load_process_model(path)


def best_of_n_scorer(scorer: str, prm: Any, settings: Any) -> Callable[[Group], Sequence[float]]:
    """The score best_of_n ranks a scored group's completions by: "logprob", "verifier", "prm" or a
    sequence-classification reward model's directory."""

    if scorer == "logprob":
        return mean_logprob_scores
    if scorer == "verifier":
        return verifier_scores
    if scorer == "prm":

        process = ProcessReward(prm, split="delimiter", delimiter=settings.step_delimiter,
                                aggregate=settings.prm_aggregate)
        return lambda group: process.score_group(group.problem, group.completions)
    if Path(scorer).is_dir():

        reward_model = ClassifierReward.from_pretrained(scorer)
        return lambda group: reward_model.score_group(group.problem, group.completions)
    raise ValueError(f"--scorer {scorer!r} is neither logprob, verifier, prm nor a reward model directory")


def _step_generator(engine: Any, tokenizer: Any) -> Any:
    """Beam search's step generator: exact token continuation when the engine samples from token ids
    (`continue_from`), else the engine's model without its chat template (a shallow copy, sharing the
    model and its packed weights) continuing the prompt rendered through the template plus the
    partial solution as text."""

    def decode(ids: Sequence[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=True)

    if callable(getattr(engine, "continue_from", None)):
        return TokenContinuation(prompt_ids=engine.prompt_ids, continue_from=engine.continue_from, decode=decode)
    plain = copy.copy(engine)
    plain.chat_template = False
    return TextContinuation(plain, decode=decode, render=chat_prompt(tokenizer))


def _config(args: argparse.Namespace) -> Any:
    """The --config (with --set overrides), or None."""

    if not args.config:
        if args.set:
            raise ValueError("--set overrides a knob of --config: give --config too")
        return None
    if bad := [item for item in args.set if "=" not in item]:
        raise ValueError(f"--set takes section.key=value, got {bad}")
    return load_config(config_path(args.config), args.set)


def _context(cfg: Any) -> str:
    """What else than the sampling settings the completions depend on, for the cache key: the
    config's agent settings, task template and chat template ('' without --config)."""
    if cfg is None:
        return ""
    return json.dumps({"agent": cfg.to_dict()["agent"], "prompt_template": cfg.task.prompt_template,
                       "chat_template": cfg.model.chat_template}, sort_keys=True)


@dataclass(frozen=True)
class LoadedModel:
    """The model under evaluation: the engine sampling from it, its tokenizer and weights (None
    when served), and its identity (`eval.identity`)."""

    engine: Any
    tokenizer: Any
    model: Any
    identity: ModelIdentity


def _served(args: argparse.Namespace, cfg: Any) -> bool:
    """The model is served (--engine openai, or --config with rollout.engine=openai)."""
    return args.engine == "openai" or (cfg is not None and cfg.rollout.engine == "openai")


def _engine(args: argparse.Namespace, cfg: Any = None) -> LoadedModel:
    """The engine for args.model: with --config as its run's rollouts sample (rollout.dtype, fused
    decoder, CUDA graphs, run.device, model.chat_template, agent.*), else with the defaults."""

    prm = local_source(args.prm) if args.prm and Path(args.prm).is_dir() else {}  # load_prm wants a directory
    if _served(args, cfg):

        url = args.url or (cfg.rollout.openai_url if cfg is not None else "")
        if not url:
            raise ValueError("--engine openai needs --url http://HOST:PORT/v1")
        identity = ModelIdentity(args.model, served_source(url, args.model), {"engine": "openai"}, prm)
        return LoadedModel(OpenAIEngine(url, args.model), None, None, identity)
    from transformers.utils import logging as transformers_logging


    if args.no_progress:
        transformers_logging.disable_progress_bar()  # its weight-loading bar too
    base = cfg if cfg is not None else load_config()
    try:
        device = pick_device(base.run.device)
    except RuntimeError as exc:  # the run's device is not on this machine
        raise ValueError(f"{exc} (with --config: --set run.device=auto)") from exc
    dtype = resolve_dtype(base.rollout.dtype, device)
    model = load_model(args.model, dtype=dtype, device=device)
    tokenizer = load_tokenizer(args.model)
    engine = HFEngine(model, tokenizer, chat_template=base.model.chat_template, fused=base.rollout.fused,
                      cuda_graphs=base.rollout.cuda_graphs)
    decoding = {"engine": "hf", "dtype": str(dtype).removeprefix("torch."), "device": device.type,
                "fused": engine.fused is not None}
    identity = ModelIdentity(args.model, model_source(args.model), decoding, prm)
    if base.agent.environment:

        return LoadedModel(build_agent_engine(base, engine), tokenizer, model, identity)
    return LoadedModel(engine, tokenizer, model, identity)
