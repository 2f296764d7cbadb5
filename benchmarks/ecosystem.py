"""Environments and agents of other ecosystems, trained by reasonrl: do they learn as the native task does,
and what does the endpoint cost? (docs/benchmarks.md, "Environments and agents of other ecosystems")

Four arms on the arithmetic task (sums of two 2-digit numbers, the default job's problems and prompt), every
run SmolLM2-135M-Instruct with the default job's settings but `--steps` steps, evaluated before and after on the
first `--eval-problems` held-out problems (4 samples each at the training temperature; no greedy pass), one CPU
thread, one run at a time:
- native: task.name=arithmetic, the default reward (the answer checked by reasonrl's math verifier, component
  'correct', and a 0.1 bonus for a \\boxed{} answer when it is correct);
- verifiers: the same problems as a verifiers taskset defined here (`arithmetic_taskset`: one task per problem,
  in the same order, its rewards `correct` and `format` the same checks with the same weights), trained through
  the adapter (task.name=verifiers task.env=benchmarks.ecosystem:arithmetic_taskset);
- agent: an agent written with the `openai` client (`plan_then_answer`: a first call asks for a plan, a second
  for the answer; the reward is the second reply checked by the math verifier), task.agent=...;
- one_call: the agent with the native arm's single call (`one_call`: the problem's prompt as the user message,
  the reward the native one), for the endpoint's overhead per step against the native engine; on the first
  `--overhead-seeds` seeds (1 by default).

Predictions and rules are stated in the docs before the runs; the summary says whether each held:
- verifiers vs native: the paired difference (same seed) of held-out sampled accuracy after training, with
  a 95% Student-t interval over the seeds; equivalent when the interval lies within +-`MARGIN` points;
- agent: held-out sampled accuracy (its reward's mean) after - before, interval over the seeds; learns when
  the interval lies above 0;
- one_call vs native: the step time ratio (median of one_call's perf/step_s over the median of native's, same
  seed), and the same for perf/generate_s and for the step time per generated token; below `OVERHEAD_LIMIT`
  (over several seeds: the upper end of its interval).

Each run is a record in benchmarks/results/ecosystem/ARM_seedN.json (commit, arguments, device; resumed:
an existing record with the same arguments is not run again), the summary benchmarks/results/ecosystem.json,
the plot benchmarks/results/ecosystem.png. Run it from the repository's root (the runs import this module):

    python -m benchmarks.ecosystem [--steps 8] [--eval-problems 25] [--seeds 0,1,2] [--overhead-seeds 1] [--arms ...]
    python -m benchmarks.ecosystem --recorded   # the summary of the runs recorded so far, running none
    python -m benchmarks.ecosystem --overhead-probe 6   # the endpoint's cost at fixed weights, alternating
    python -m benchmarks.ecosystem --smoke   # a tiny random model, 1 step, 1 seed, records in a temp dir
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import verifiers.v1 as vf

from benchmarks import runs
from benchmarks.common import code_version, machine, pyplot, t_interval, tiny_smollm2, write_report
from reasonrl.config import DEFAULT_MODEL
from reasonrl.rewards import FormatReward, MathReward
from reasonrl.tasks.arithmetic import arithmetic_task
from reasonrl.tasks.base import DEFAULT_PROMPT_TEMPLATE
from reasonrl.types import Problem

ACCURACY = "eval/sampled_accuracy"
AGENT_ACCURACY = "eval/sampled_reward_mean"  # an agent's reward is its answer's correctness: no 'correct' component
MARGIN = 10.0  # points of held-out accuracy: the verifiers arm is equivalent to the native one within it
OVERHEAD_LIMIT = 1.25  # the one-call agent's step time over the native engine's, predicted below this
FORMAT_WEIGHT = 0.1  # the default job's reward.format_weight (gated by correctness)
VERIFIER, FORMAT = MathReward(), FormatReward(style="boxed")
MODULE = "benchmarks.ecosystem"
PLAN_TOKENS = 24  # the plan's length limit (the answer's is rollout.max_new_tokens)

# ------------------------------------------------------------------------------------- the verifiers taskset


class ArithmeticData(vf.TaskData):
    answer: str
    answer_type: str = "number"


class ArithmeticTask(vf.Task[ArithmeticData]):
    """A sum, scored as the native task scores it: reasonrl's math verifier, and the format bonus when correct."""

    def problem(self) -> Problem:
        return Problem(id=self.data.id or "", prompt=self.data.prompt or "", answer=self.data.answer,
                       metadata={"answer_type": self.data.answer_type})

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return VERIFIER(trace.last_reply, self.problem())

    @vf.reward(weight=FORMAT_WEIGHT)
    async def format(self, trace: vf.Trace) -> float:
        reply = trace.last_reply
        return FORMAT(reply, self.problem()) if VERIFIER(reply, self.problem()) > 0 else 0.0


class ArithmeticConfig(vf.TasksetConfig):
    train_size: int = 5000
    test_size: int = 200
    seed: int = 0


class ArithmeticTaskset(vf.Taskset[ArithmeticTask, ArithmeticConfig]):
    def load(self):
        c = self.config
        task = arithmetic_task(train_size=c.train_size, test_size=c.test_size, seed=c.seed,
                               prompt_template=DEFAULT_PROMPT_TEMPLATE)
        for problem in (*task.train, *task.test):
            yield ArithmeticTask(ArithmeticData(id=problem.id, prompt=problem.prompt, answer=problem.answer),
                                 self.config.task)


def arithmetic_taskset(train_size: int = 5000, test_size: int = 200, seed: int = 0) -> vf.Taskset:
    """task.env's factory: the native arithmetic task's problems (train, then held out) as a verifiers taskset."""
    return ArithmeticTaskset(ArithmeticConfig(train_size=train_size, test_size=test_size, seed=seed))


# ----------------------------------------------------------------------------------------- the agents


def _client(base_url: str) -> Any:
    import openai

    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)


def plan_then_answer(base_url: str, model: str, problem: Problem) -> float:
    """task.agent: two calls, a plan and then the answer; the reward is the answer's correctness."""
    client = _client(base_url)
    messages = [{"role": "user", "content": f"{problem.prompt}\nFirst, in one short sentence, say how you will "
                                            "solve it. Do not solve it yet."}]
    plan = client.chat.completions.create(model=model, messages=messages,
                                          max_tokens=PLAN_TOKENS).choices[0].message.content
    messages += [{"role": "assistant", "content": plan},
                 {"role": "user", "content": "Now solve it. Put the final answer in \\boxed{}."}]
    answer = client.chat.completions.create(model=model, messages=messages).choices[0].message.content
    return VERIFIER(answer or "", problem)


def one_call(base_url: str, model: str, problem: Problem) -> float:
    """task.agent: the native task's single reply through the endpoint, with the native reward."""
    reply = _client(base_url).chat.completions.create(
        model=model, messages=[{"role": "user", "content": problem.prompt}]).choices[0].message.content or ""
    correct = VERIFIER(reply, problem)
    return correct + FORMAT_WEIGHT * FORMAT(reply, problem) if correct > 0 else correct


# ------------------------------------------------------------------------------------------- the runs


def arms(args: argparse.Namespace, seed: int) -> dict[str, list[str]]:
    """Each arm's own overrides (module docstring)."""
    sizes = {"train_size": args.train_size, "test_size": args.test_size, "seed": seed}
    return {"native": [],
            "verifiers": ["task.name=verifiers", f"task.env={MODULE}:arithmetic_taskset",
                          f"task.env_args={json.dumps(sizes)}"],
            "agent": [f"task.agent={MODULE}:plan_then_answer"],
            "one_call": [f"task.agent={MODULE}:one_call"]}


def settings(args: argparse.Namespace) -> list[str]:
    """What every run shares: the default job at this study's budget, one thread."""
    # The defaults the study ran with, since changed (benchmarks/runs.py).
    return [*runs.AS_MEASURED, f"model.name={args.model}", f"train.steps={args.steps}", f"task.train_size={args.train_size}",
            f"task.test_size={args.test_size}", f"eval.problems={args.eval_problems}", "eval.greedy=false",
            "eval.before=true",
            # The learning rate the study was planned and first run at, the default then (5e-6 since).
            "run.threads=1", "run.sync_check=false", "train.lr=2e-5", *args.extra]


def specs(args: argparse.Namespace) -> list[runs.RunSpec]:
    """Seed-major, so that a partial study compares the arms on the seeds it has."""
    return [runs.RunSpec(args.study, f"{arm}_seed{seed}", None, (*settings(args), *overrides, f"run.seed={seed}"),
                         extra={"arm": arm, "seed": seed})
            for seed in args.seeds for arm, overrides in arms(args, seed).items()
            if arm in args.arms and (arm != "one_call" or seed in args.seeds[:args.overhead_seeds])]


def recorded(spec: runs.RunSpec) -> dict[str, Any] | None:
    """The run's record if it ran with these arguments, else None (nothing is run)."""
    path = runs.record_path(spec.study, spec.name)
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    return record if (record.get("config"), record.get("args")) == (spec.config, list(spec.args)) else None


# ------------------------------------------------------------------------------------------ the summary


def accuracy(record: dict[str, Any], which: int) -> float:
    """Held-out sampled accuracy in points at evaluation `which` (0: before training, -1: after)."""
    evaluation = record["evals"][which]
    return 100 * evaluation.get(ACCURACY, evaluation.get(AGENT_ACCURACY, float("nan")))


def interval(values: list[float]) -> dict[str, Any]:
    mean, low, high = t_interval(values)
    return {"mean": mean, "ci95": [low, high], "per_seed": values}


def summarize(records: dict[str, dict[int, dict[str, Any]]], seeds: list[int]) -> dict[str, Any]:
    """Each arm's accuracies, and each prediction's numbers and verdict, over the seeds every arm it reads has."""
    arms_ = {arm: {"before": interval([accuracy(r, 0) for r in by_seed.values()]),
                   "after": interval([accuracy(r, -1) for r in by_seed.values()]),
                   "step_s_median": statistics.median(s for r in by_seed.values() for s in r["curves"]["perf/step_s"]),
                   "wall_s": [r["wall_s"] for r in by_seed.values()], "seeds": list(by_seed),
                   "commits": sorted({r["commit"] for r in by_seed.values()})}
             for arm, by_seed in records.items() if by_seed}
    predictions: dict[str, Any] = {}

    def paired(a: str, b: str) -> list[int]:
        return [s for s in seeds if s in records.get(a, {}) and s in records.get(b, {})]

    if shared := paired("verifiers", "native"):
        differences = [accuracy(records["verifiers"][s], -1) - accuracy(records["native"][s], -1) for s in shared]
        result = interval(differences)
        low, high = result["ci95"]
        predictions["verifiers_equivalent"] = {
            **result, "seeds": shared, "margin": MARGIN, "held": decided(low, -MARGIN <= low and high <= MARGIN),
            "differing": sorted({key for s in shared
                                 for key in differing(records["verifiers"][s], records["native"][s])}),
            "rule": f"the 95% interval of verifiers - native (points) lies within +-{MARGIN:g}"}
    if agent := records.get("agent"):
        gains = [accuracy(r, -1) - accuracy(r, 0) for r in agent.values()]
        result = interval(gains)
        predictions["agent_learns"] = {**result, "seeds": list(agent),
                                       "held": decided(result["ci95"][0], result["ci95"][0] > 0),
                                       "rule": "the 95% interval of after - before (points) lies above 0"}
    if shared := paired("one_call", "native"):
        predictions["endpoint_overhead"] = overhead(records, shared)
    return {"arms": arms_, "predictions": predictions}


def decided(bound: float, held: bool) -> bool | None:
    """Whether a prediction held; None (undecided) when its interval has no bounds (one seed)."""
    return None if math.isnan(bound) else bool(held)


def differing(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The per-step curves and evaluation metrics in which two runs differ, times aside (perf/*)."""
    curves = [key for key in {*a["curves"], *b["curves"]} if not key.startswith("perf/")
              and a["curves"].get(key) != b["curves"].get(key)]
    evals = {key for x, y in zip(a["evals"], b["evals"]) for key in {*x, *y} if x.get(key) != y.get(key)}
    return [*curves, *evals]


def overhead(records: dict[str, dict[int, dict[str, Any]]], seeds: list[int]) -> dict[str, Any]:
    """The one-call agent's per-step times over the native engine's, median over steps, per seed."""
    def median_ratio(arm: str, seed: int, numerator: str, denominator: str | None = None) -> float:
        curves = records[arm][seed]["curves"]
        values = curves[numerator] if denominator is None else [
            n / d for n, d in zip(curves[numerator], curves[denominator]) if d]
        return statistics.median(values)

    ratios = {}
    for name, numerator, denominator in (("step_s", "perf/step_s", None), ("generate_s", "perf/generate_s", None),
                                         ("step_s_per_token", "perf/step_s", "rollout/generated_tokens")):
        ratios[name] = interval([median_ratio("one_call", s, numerator, denominator)
                                 / median_ratio("native", s, numerator, denominator) for s in seeds])
    step = ratios["step_s"]
    bound = step["mean"] if len(seeds) == 1 else step["ci95"][1]  # a measurement, on as many seeds as were run
    return {**ratios, "seeds": seeds, "limit": OVERHEAD_LIMIT, "held": bool(bound < OVERHEAD_LIMIT),
            "rule": f"the step time ratio one_call / native (its 95% interval's upper end over several seeds) lies "
                    f"below {OVERHEAD_LIMIT:g}"}


def overhead_probe(args: argparse.Namespace) -> dict[str, Any]:
    """The endpoint's cost at fixed weights, free of the machine's load changing between runs: the same
    problems (4 x 8 samples, the training settings) generated by the native engine and by the one-call
    agent through the endpoint in front of it, alternately, `args.overhead_probe` times each (after one
    of each to warm up). Ratios endpoint / native of the time and of the time per generated token, with
    their 95% interval over the repetitions (each pair the same problems)."""
    import time
    from dataclasses import replace

    import torch

    from reasonrl import load_config
    from reasonrl.agents.openai_agents import OpenAIAgentEngine
    from reasonrl.build import build_policy, build_task
    from reasonrl.rollout.choice import build_engine
    from reasonrl.types import SamplingParams

    torch.set_num_threads(1)
    cfg, device = load_config(overrides=[f"model.name={args.model}", *args.extra]), torch.device("cpu")
    tokenizer, policy = build_policy(cfg, device, None)
    native = build_engine(cfg, policy, tokenizer, device)
    endpoint = OpenAIAgentEngine(native, one_call, model_name=cfg.model.name)
    train, r = build_task(cfg).train, cfg.rollout
    sampling = SamplingParams(n=r.group_size, temperature=r.temperature, max_new_tokens=r.max_new_tokens)

    def timed(engine: Any, repeat: int) -> tuple[float, int]:
        problems = train[repeat * r.prompts_per_step:(repeat + 1) * r.prompts_per_step]
        start = time.perf_counter()
        groups = engine.generate(problems, replace(sampling, seed=repeat))
        return time.perf_counter() - start, sum(len(c.token_ids) for g in groups for c in g.completions)

    timed(native, 0), timed(endpoint, 0)
    pairs = []
    for repeat in range(1, args.overhead_probe + 1):
        order = (native, endpoint) if repeat % 2 else (endpoint, native)
        measured = {id(engine): timed(engine, repeat) for engine in order}
        pairs.append((measured[id(native)], measured[id(endpoint)]))
    endpoint.close()
    return {"repeats": args.overhead_probe, "pairs": [{"native_s": n[0], "native_tokens": n[1], "endpoint_s": e[0],
                                                       "endpoint_tokens": e[1]} for n, e in pairs],
            "time_ratio": over_repeats([e[0] / n[0] for n, e in pairs]),
            "time_per_token_ratio": over_repeats([(e[0] / e[1]) / (n[0] / n[1]) for n, e in pairs]),
            "commit": code_version(), "machine": machine()}


def over_repeats(values: list[float]) -> dict[str, Any]:
    mean, low, high = t_interval(values)
    return {"mean": mean, "ci95": [low, high], "per_repeat": values}


def plot(records: dict[str, dict[int, dict[str, Any]]], report: dict[str, Any], path: Path) -> bool:
    """Left: reward per step (mean over seeds) of each arm; right: held-out accuracy before and after (95% CI)."""
    plt = pyplot()
    if plt is None:
        return False
    figure, (curves, bars) = plt.subplots(1, 2, figsize=(11, 4))
    for arm, by_seed in records.items():
        series = [r["curves"]["reward/mean"] for r in by_seed.values()]
        if series:
            steps = min(len(s) for s in series)
            curves.plot(range(1, steps + 1), [statistics.fmean(s[i] for s in series) for i in range(steps)],
                        marker=".", label=f"{arm} ({len(series)} seeds)")
    curves.set(xlabel="training step", ylabel="reward (mean over seeds)", title="training reward")
    curves.legend(fontsize=8)
    for offset, when in ((-0.18, "before"), (0.18, "after")):
        names = list(report["arms"])
        means = [report["arms"][arm][when]["mean"] for arm in names]
        errors = [[m - report["arms"][arm][when]["ci95"][0] for m, arm in zip(means, names)],
                  [report["arms"][arm][when]["ci95"][1] - m for m, arm in zip(means, names)]]
        bars.bar([i + offset for i in range(len(names))], means, width=0.36, label=when,
                 yerr=[[0.0 if math.isnan(e) else e for e in side] for side in errors], capsize=3)
    bars.set_xticks(range(len(report["arms"])), list(report["arms"]))
    bars.set(ylabel="held-out sampled accuracy (%)", title="before and after training (95% CI)")
    bars.legend(fontsize=8)
    figure.suptitle("SmolLM2-135M-Instruct on sums: native, verifiers taskset, OpenAI-SDK agents", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    return True


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="training steps of every run (default 8)")
    parser.add_argument("--eval-problems", type=int, default=25, help="held-out problems evaluated before and after")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds (default 0,1,2)")
    parser.add_argument("--overhead-seeds", type=int, default=1, help="seeds of the one_call arm (the first ones)")
    parser.add_argument("--arms", default="native,verifiers,agent,one_call", help="the arms to run (default all)")
    parser.add_argument("--overhead-probe", type=int, default=0, metavar="N", help="instead: N alternate "
                        "generations of the native engine and of the endpoint at fixed weights (overhead_probe.json)")
    parser.add_argument("--recorded", action="store_true", help="summarise the runs already recorded, run none")
    parser.add_argument("--smoke", action="store_true", help="a tiny random model, 1 step, 1 seed, records in a "
                        "temporary directory: that the study runs, not what it measures")
    parser.add_argument("extra", nargs="*", metavar="section.key=value", help="overrides for every run")
    args = parser.parse_args(argv)
    args.seeds, args.arms = [int(s) for s in args.seeds.split(",")], args.arms.split(",")
    args.model, args.study, args.train_size, args.test_size = DEFAULT_MODEL, "ecosystem", 5000, 200
    return args


def main(argv: list[str]) -> dict[str, Any]:
    args = parse(argv)
    if args.overhead_probe:
        probe = overhead_probe(args)
        path = runs.RESULTS / args.study / "overhead_probe.json"
        path.write_text(json.dumps(probe, indent=1) + "\n")
        print(json.dumps({key: probe[key] for key in ("time_ratio", "time_per_token_ratio")}, indent=1))
        return probe
    with tempfile.TemporaryDirectory(prefix="ecosystem_smoke_") as scratch:
        if args.smoke:  # everything in the scratch directory: nothing recorded under benchmarks/results
            runs.RESULTS = Path(scratch) / "results"
            args.model = str(tiny_smollm2(Path(scratch) / "model"))
            args.steps, args.seeds, args.eval_problems, args.train_size, args.test_size = 1, [0], 4, 16, 4
            args.extra = ["rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8",
                          *args.extra]
        records: dict[str, dict[int, dict[str, Any]]] = {arm: {} for arm in args.arms}
        for spec in specs(args):
            record = recorded(spec) if args.recorded else spec.run(threads=1)
            if record is not None:
                records[spec.extra["arm"]][spec.extra["seed"]] = record
        report = {"what": "SmolLM2-135M-Instruct on the arithmetic task: native, a verifiers taskset through the "
                          "adapter, an OpenAI-SDK agent of two calls, a one-call agent (the endpoint's overhead); "
                          "95% t-intervals over seeds",
                  "commit": code_version(), "smoke": args.smoke, "steps": args.steps,
                  "eval_problems": args.eval_problems, "seeds": args.seeds, "settings": settings(args),
                  "arm_overrides": {arm: arms(args, 0)[arm] for arm in args.arms}, "machine": machine(),
                  **summarize(records, args.seeds)}
        if args.smoke:
            print(json.dumps(report["predictions"], indent=1))
            return report
    write_report("ecosystem", report)
    plot(records, report, runs.RESULTS / "ecosystem.png")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
