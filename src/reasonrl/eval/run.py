"""`reasonrl eval`: sample n completions per problem of one or more tasks, check them, and report
pass@k, maj@k and mean@k with bootstrap intervals, lengths, truncation, a per-difficulty
breakdown and test-time scaling curves, as JSON and as a Markdown table.

Completions are cached in OUT/completions.jsonl (one line per problem, keyed by task, problem id
and the sampling settings), so an interrupted evaluation resumes where it stopped and a second run
with other k or other test-time scaling methods regenerates nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from reasonrl.eval.metrics import bootstrap_ci, maj_at_k, mean_at_k, pass_at_k
from reasonrl.eval.tts import METHODS, Sample, scaling_curve
from reasonrl.rewards import WeightedReward, score_groups
from reasonrl.rewards.math import extract_answer
from reasonrl.rewards.unsupervised import answer_clusters
from reasonrl.rollout.base import RolloutEngine
from reasonrl.types import Completion, Group, Problem, SamplingParams

DIFFICULTY_FIELDS = ("difficulty", "level")


@dataclass(frozen=True)
class EvalSettings:
    n: int = 4
    ks: tuple[int, ...] = (1,)
    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 512
    seed: int = 0
    tts: tuple[str, ...] = ()
    budgets: tuple[int, ...] = ()
    chunk_size: int = 8
    stop: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.n < 1 or any(not 1 <= k <= self.n for k in self.ks):
            raise ValueError(f"every k must be between 1 and n={self.n}, got k={list(self.ks)}")
        if any(not 1 <= b <= self.n for b in self.budgets):
            raise ValueError(f"every test-time scaling budget must be between 1 and n={self.n}, got {list(self.budgets)}")
        if unknown := [m for m in self.tts if m not in METHODS]:
            raise ValueError(f"unknown test-time scaling methods {unknown}; known: {', '.join(METHODS)}")

    def sampling_key(self) -> str:
        """What the cached completions depend on."""
        key = json.dumps([self.n, self.temperature, self.top_p, self.max_new_tokens, self.seed, list(self.stop)])
        return hashlib.sha256(key.encode()).hexdigest()[:16]


def evaluate_tasks(engine: RolloutEngine, tasks: dict[str, Sequence[Problem]], reward: WeightedReward,
                   settings: EvalSettings, out_dir: Path, *, model_name: str = "",
                   score_fn: Callable[[Group], Sequence[float]] | None = None, progress: bool = True) -> dict[str, Any]:
    """Evaluate each task's problems; write OUT/results.json and OUT/results.md and return the results.

    `score_fn(group)` gives each completion's best-of-n score (a reward model); by default the
    mean token log-probability, which also weights `weighted_majority`.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    cache = _CompletionCache(out_dir / "completions.jsonl", settings.sampling_key())
    results: dict[str, Any] = {"model": model_name, "settings": asdict(settings), "tasks": {}}
    total = sum(len(problems) for problems in tasks.values())
    bar = tqdm(total=total, desc="eval", unit="problem", disable=not progress)
    for task_name, problems in tasks.items():
        groups = _generate_cached(engine, task_name, problems, settings, cache, bar)
        scored = score_groups(groups, reward)
        results["tasks"][task_name] = task_metrics(scored, settings, score_fn or mean_logprob_scores)
    bar.close()
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out_dir / "results.md").write_text(markdown_table(results))
    return results


def mean_logprob_scores(group: Group) -> list[float]:
    return [sum(c.logprobs) / max(len(c.logprobs), 1) for c in group.completions]


def task_metrics(groups: Sequence[Group], settings: EvalSettings,
                 score_fn: Callable[[Group], Sequence[float]]) -> dict[str, Any]:
    """pass@k / maj@k / mean@k (each with a 95% bootstrap interval over problems), length,
    truncation, per-difficulty accuracy and test-time scaling curves of scored groups."""
    pools = [_samples(group, score_fn) for group in groups]
    metrics: dict[str, Any] = {"problems": len(groups)}
    for k in settings.ks:
        for name, per_problem in (
            (f"pass@{k}", [pass_at_k(len(p), sum(s.correct for s in p), k) for p in pools]),
            (f"maj@{k}", [maj_at_k([s.answer for s in p], [s.correct for s in p], k) for p in pools]),
            (f"mean@{k}", [mean_at_k(len(p), sum(s.correct for s in p), k) for p in pools]),
        ):
            low, high = bootstrap_ci(per_problem)
            metrics[name] = {"value": sum(per_problem) / len(per_problem), "ci95": [low, high]}
    completions = [c for g in groups for c in g.completions]
    metrics["length_mean"] = sum(len(c.token_ids) for c in completions) / len(completions)
    metrics["truncated_frac"] = sum(c.finish_reason == "length" for c in completions) / len(completions)
    metrics["by_difficulty"] = _by_difficulty(groups, pools)
    metrics["tts"] = {method: scaling_curve(pools, method, settings.budgets or settings.ks) for method in settings.tts}
    return metrics


def _samples(group: Group, score_fn: Callable[[Group], Sequence[float]]) -> list[Sample]:
    """One problem's completions as test-time scaling sees them; equal answers (math_equal) share a cluster id."""
    correct = group.reward_components.get("correct", group.rewards)
    answers: list[str | None] = [extract_answer(c.text) for c in group.completions]
    cluster_of: dict[int, int] = {}
    for cluster_id, members in enumerate(answer_clusters(answers)):
        for index in members:
            cluster_of[index] = cluster_id
    scores = list(score_fn(group))
    return [Sample(answer=cluster_of.get(i), correct=correct[i] > 0, score=scores[i], weight=math.exp(scores[i]),
                   tokens=len(c.token_ids)) for i, c in enumerate(group.completions)]


def _by_difficulty(groups: Sequence[Group], pools: Sequence[list[Sample]]) -> dict[str, dict[str, float]]:
    levels: dict[str, list[float]] = {}
    for group, pool in zip(groups, pools):
        level = next((group.problem.metadata[f] for f in DIFFICULTY_FIELDS if f in group.problem.metadata), None)
        if level is not None:
            levels.setdefault(str(level), []).append(sum(s.correct for s in pool) / len(pool))
    return {level: {"problems": len(values), "mean_accuracy": sum(values) / len(values)}
            for level, values in sorted(levels.items())}


def markdown_table(results: dict[str, Any]) -> str:
    """The headline numbers of every task, one row each."""
    metric_names = [name for name in next(iter(results["tasks"].values()), {}) if "@" in name]
    header = ["task", "problems", *metric_names, "length", "truncated"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for task, m in results["tasks"].items():
        cells = [task, str(m["problems"])]
        cells += [f"{m[name]['value']:.3f} [{m[name]['ci95'][0]:.3f}, {m[name]['ci95'][1]:.3f}]" for name in metric_names]
        cells += [f"{m['length_mean']:.1f}", f"{m['truncated_frac']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    for task, m in results["tasks"].items():
        for method, rows in m["tts"].items():
            lines.append(f"\n{task}, {method}: " + ", ".join(f"b={int(r['budget'])}: {r['accuracy']:.3f}" for r in rows))
    return "\n".join(lines) + "\n"


class _CompletionCache:
    """Generated groups on disk, one JSON line per (task, problem, sampling settings)."""

    def __init__(self, path: Path, sampling_key: str):
        self.path, self.sampling_key = path, sampling_key
        self.stored: dict[tuple[str, str], dict] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a crash: that problem is generated again
                    continue
                if record.get("sampling") == sampling_key:
                    self.stored[record["task"], record["problem_id"]] = record

    def get(self, task: str, problem: Problem) -> Group | None:
        record = self.stored.get((task, problem.id))
        if record is None:
            return None
        completions = tuple(Completion(token_ids=tuple(c["token_ids"]), text=c["text"], logprobs=tuple(c["logprobs"]),
                                       finish_reason=c["finish_reason"]) for c in record["completions"])
        return Group(problem=problem, prompt_ids=tuple(record["prompt_ids"]), completions=completions)

    def put(self, task: str, group: Group) -> None:
        record = {"task": task, "problem_id": group.problem.id, "sampling": self.sampling_key,
                  "prompt_ids": list(group.prompt_ids), "completions": [asdict(c) for c in group.completions]}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def _generate_cached(engine: RolloutEngine, task: str, problems: Sequence[Problem], settings: EvalSettings,
                     cache: _CompletionCache, bar: tqdm) -> list[Group]:
    """Every problem's group, generated in fixed chunks of the problem list (a chunk found whole in
    the cache is not generated again). A chunk's seed depends on its first problem, so a resumed
    evaluation samples exactly what a straight one would have."""
    sampling = SamplingParams(n=settings.n, temperature=settings.temperature, top_p=settings.top_p,
                              max_new_tokens=settings.max_new_tokens, stop=settings.stop)
    groups: list[Group] = []
    for start in range(0, len(problems), settings.chunk_size):
        chunk = problems[start : start + settings.chunk_size]
        cached = [cache.get(task, problem) for problem in chunk]
        if all(group is not None for group in cached):
            groups.extend(cached)  # type: ignore[arg-type]
        else:
            digest = hashlib.sha256(f"{settings.seed}/{task}/{chunk[0].id}".encode()).hexdigest()
            generated = engine.generate(chunk, replace(sampling, seed=int(digest[:12], 16)))
            for group in generated:
                cache.put(task, group)
            groups.extend(generated)
        bar.update(len(chunk))
    return groups
