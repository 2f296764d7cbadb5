"""`reasonrl eval`: sample n completions per problem of one or more tasks, check them, and report
pass@k, maj@k and mean@k with bootstrap intervals, lengths, truncation, a per-difficulty
breakdown and test-time scaling curves, as JSON and as a Markdown table.

Completions are cached in OUT/completions.jsonl (`eval.cache`: one line per problem, keyed by task,
problem id and text, the sampling settings and the model's identity, `eval.identity`), so an interrupted
evaluation resumes where it stopped and a second run with other k or other test-time scaling
methods regenerates nothing. OUT/model.json records which model OUT evaluates: another model is
refused there, so that OUT's results and caches only ever describe that one model.

An engine that plays episodes (`agents.AgentEngine`, multi-turn tool use) is evaluated the same
way: a completion is an episode, its correctness the reward's "correct" component (the verifier's
verdict on the final answer), its length the tokens the model wrote (not the inserted tool
outputs); the other reward components (tool-use statistics) are reported as their means, and the
episodes are cached with their records.

Test-time scaling from that pool (`eval.tts`): self-consistency ("majority"), confidence-weighted
self-consistency ("weighted_majority", each vote weighted by the completion's geometric-mean token
probability exp(mean log-prob); Wang et al. 2023, Kang et al. 2025), best-of-N by a score
("best_of_n": the mean token log-prob by default, or the task's verifier, or a reward model, through
`score_fn`) and "pass". PRM-guided beam search (`eval.search`; Snell et al. 2024) generates its own
solutions per budget, the budget being the number of beams N: "beam" answers with the PRM's best
solution, "beam_majority" with the answer of largest total PRM score. Its solutions are cached in
OUT/beams.jsonl, keyed by the search settings and N.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from reasonrl.eval.cache import BeamCache, CompletionCache, EvalOutputError
from reasonrl.eval.chunking import problems_per_chunk
from reasonrl.eval.identity import ModelIdentity
from reasonrl.eval.metrics import bootstrap_ci, maj_at_k, mean_at_k, pass_at_k
from reasonrl.eval.search import BeamConfig, BeamResult, StepGenerator, beam_search
from reasonrl.eval.tts import METHODS, Sample, best_of_n, scaling_curve, weighted_majority
from reasonrl.rewards import WeightedReward, score_groups
from reasonrl.rewards.answers import extract_answer
from reasonrl.rewards.bounded import timeouts_on_this_thread
from reasonrl.rewards.process import StepScorer
from reasonrl.rewards.unsupervised import answer_clusters
from reasonrl.types import Completion, Group, Problem, RolloutEngine, SamplingParams

DIFFICULTY_FIELDS = ("difficulty", "level")
SEARCH_METHODS = {"beam": best_of_n, "beam_majority": weighted_majority}
"""Beam search's answer: the solution the PRM scores best, or the answer with the largest total PRM score."""


BEAM_CHUNK = 8  # problems searched together


@dataclass(frozen=True)
class Scoring:
    """How one task's completions are scored: `reward` (its "correct" component is accuracy), and
    `checker`, what decides "correct" in words (results.json's "scored_by")."""

    reward: WeightedReward
    checker: str


@dataclass(frozen=True)
class EvalSettings:
    n: int = 4
    ks: tuple[int, ...] = (1,)
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 512
    seed: int = 0
    tts: tuple[str, ...] = ()
    budgets: tuple[int, ...] = ()
    chunk_size: int = 0  # problems generated together; 0: about 64 sequences (eval/chunking.py)
    stop: tuple[str, ...] = field(default_factory=tuple)
    scorer: str = "logprob"  # what best_of_n ranks by (recorded; the scores come from evaluate_tasks' score_fn)
    prm: str = ""  # the PRM of beam search (recorded, and part of the beam cache key)
    beam_width: int = 4
    step_delimiter: str = "\n\n"
    prm_aggregate: str = "last"
    max_steps: int = 40
    max_step_tokens: int = 256
    context: str = ""  # what else the completions depend on (an agent config's settings): part of the cache key

    def __post_init__(self) -> None:
        if self.n < 1 or any(not 1 <= k <= self.n for k in self.ks):
            raise ValueError(f"every k must be between 1 and n={self.n}, got k={list(self.ks)}")
        if unknown := [m for m in self.tts if m not in METHODS and m not in SEARCH_METHODS]:
            known = ", ".join([*METHODS, *SEARCH_METHODS])
            raise ValueError(f"unknown test-time scaling methods {unknown}; known: {known}")
        if any(b < 1 for b in self.budgets) or (self.pool_methods and any(b > self.n for b in self.budgets)):
            raise ValueError(f"every test-time scaling budget must be between 1 and n={self.n} (the samples drawn "
                             f"for {', '.join(self.pool_methods)}), got {list(self.budgets)}")
        if self.search_methods:
            if self.top_k:
                raise ValueError("beam search samples its steps without top-k: pass --top-k 0 (a --config's "
                                 "rollout.top_k is taken otherwise)")
            if not self.budgets:
                raise ValueError("beam search needs --budget: the numbers of beams N, e.g. 1,2,4,8,16")
            self.beam_config(self.budgets[0])  # bad search settings fail here, not after sampling

    @property
    def pool_methods(self) -> tuple[str, ...]:
        return tuple(m for m in self.tts if m in METHODS)

    @property
    def search_methods(self) -> tuple[str, ...]:
        return tuple(m for m in self.tts if m in SEARCH_METHODS)

    def beam_config(self, beams: int) -> BeamConfig:
        return BeamConfig(beams=beams, width=self.beam_width, delimiter=self.step_delimiter,
                          aggregate=self.prm_aggregate, max_steps=self.max_steps,  # type: ignore[arg-type]
                          max_step_tokens=self.max_step_tokens, max_new_tokens=self.max_new_tokens,
                          temperature=self.temperature, top_p=self.top_p)

    def beam_key(self, beams: int, model_key: str) -> str:
        """What a cached beam search depends on, with `model_key` (`ModelIdentity.beam_key`)."""
        key = json.dumps([asdict(self.beam_config(beams)), self.seed, self.prm, model_key])
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    @property
    def problems_per_chunk(self) -> int:
        """Problems sampled in one engine call."""
        return self.chunk_size or problems_per_chunk(self.n)

    def sampling_key(self, model_key: str) -> str:
        """What the cached completions depend on, with `model_key` (`ModelIdentity.key`): a chunk's
        seed comes from its first problem, so the chunking is part of it."""
        parts = [self.n, self.temperature, self.top_p, self.max_new_tokens, self.seed, list(self.stop),
                 self.context, self.problems_per_chunk, model_key]
        if self.top_k:  # appended only when set, so that caches written before top_k existed still match
            parts.append({"top_k": self.top_k})
        key = json.dumps(parts)
        return hashlib.sha256(key.encode()).hexdigest()[:16]


def evaluate_tasks(engine: RolloutEngine, tasks: dict[str, Sequence[Problem]], scoring: Mapping[str, Scoring],
                   settings: EvalSettings, out_dir: Path, *, model: ModelIdentity,
                   score_fn: Callable[[Group], Sequence[float]] | None = None, prm: StepScorer | None = None,
                   step_generator: StepGenerator | None = None, progress: bool = True) -> dict[str, Any]:
    """Evaluate each task's problems, scored by its `scoring`; write OUT/results.json and
    OUT/results.md and return the results. `model` is the identity of the model `engine` samples
    from: OUT evaluates one model only (EvalOutputError for another), and caches are keyed by it.

    `score_fn(group)` gives each completion of a scored group its best-of-n score (`verifier_scores`,
    a reward model's `score_group`, ...); by default the mean token log-probability. Beam search
    ("beam", "beam_majority" in settings.tts) needs the PRM `prm` and a `step_generator` that
    continues partial solutions (`eval.search.TextContinuation` over an engine).
    """
    if settings.search_methods and (prm is None or step_generator is None):
        raise ValueError(f"test-time scaling {', '.join(settings.search_methods)} needs a process reward model and a "
                         "step generator: evaluate_tasks(..., prm=ModelPRM(...), step_generator=TextContinuation(...))")
    if missing := [name for name in tasks if name not in scoring]:
        raise ValueError(f"evaluate_tasks: no scoring for the tasks {missing}; give scoring[task] for every task")
    claim_output(out_dir, model)
    cache = CompletionCache(out_dir / "completions.jsonl", settings.sampling_key(model.key()))
    beam_cache = BeamCache(out_dir / "beams.jsonl", model.beam_key())
    results: dict[str, Any] = {"model": model.name, "model_source": dict(model.source), "engine": dict(model.engine),
                               "settings": asdict(settings), "tasks": {}}
    total = sum(len(problems) for problems in tasks.values())
    bar = tqdm(total=total, desc="eval", unit="problem", disable=not progress)
    for task_name, problems in tasks.items():
        reward = scoring[task_name].reward
        groups = _generate_cached(engine, task_name, problems, settings, cache, bar)
        scored = score_groups(groups, reward)
        metrics = task_metrics(scored, settings, score_fn or mean_logprob_scores)
        metrics["scored_by"] = {"checker": scoring[task_name].checker, "reward_weights": reward.weights}
        if settings.search_methods:
            metrics["tts"] |= beam_curves(step_generator, prm, task_name, problems, reward,  # type: ignore[arg-type]
                                          settings, beam_cache, progress=progress)
        results["tasks"][task_name] = metrics
    bar.close()
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out_dir / "results.md").write_text(markdown_table(results))
    return results


def check_output_dir(out_dir: Path) -> None:
    """EvalOutputError when `out_dir` cannot be an output directory: it, or a folder above it, is a file."""
    for path in (out_dir, *out_dir.parents):
        if path.exists() and not path.is_dir():
            raise EvalOutputError(f"the output directory {out_dir} cannot be made: {path} is a file; name a "
                                  "directory for the results with --out (a new one, or one an earlier evaluation "
                                  "of this model wrote)")


def claim_output(out_dir: Path, model: ModelIdentity) -> None:
    """Make `out_dir` the evaluation of `model` (OUT/model.json), or refuse when it holds another
    model's: its results and cached completions are that model's, never to be reported as these."""
    check_output_dir(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EvalOutputError(f"cannot make the output directory {out_dir}: {exc.strerror or exc}; name another "
                              "with --out") from exc
    path = out_dir / "model.json"
    source = json.loads(json.dumps(model.source))  # as it reads back from the file
    if not path.exists():
        path.write_text(json.dumps({"model": model.name, "source": source}, indent=2) + "\n")
        return
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
        recorded_source, recorded_name = recorded["source"], recorded["model"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise EvalOutputError(f"{path} does not say which model {out_dir} evaluates ({type(exc).__name__}); delete "
                              f"{out_dir}, or pass --out with another directory") from exc
    if recorded_source != source:
        raise EvalOutputError(f"{out_dir} holds the evaluation of another model: {recorded_name} "
                              f"({_difference(recorded_source, source)}); pass --out with another directory for "
                              f"{model.name}, or delete {out_dir} to evaluate it there")


def _difference(recorded: Mapping[str, Any], source: Mapping[str, Any]) -> str:
    """How the model `recorded` differs from `source`, in words."""
    if "path" in recorded and recorded.get("path") == source.get("path"):
        old, new = recorded.get("files", {}), source.get("files", {})
        changed = sorted(name for name in old.keys() | new.keys() if old.get(name) != new.get(name))
        return f"the files of {recorded['path']} have changed since: {', '.join(changed)}"
    return (f"{ModelIdentity('', recorded).describe()}, where this is "
            f"{ModelIdentity('', source).describe()}")


def mean_logprob_scores(group: Group) -> list[float]:
    return [_mean_logprob(c) for c in group.completions]


def verifier_scores(group: Group) -> list[float]:
    """Each completion's total reward from the task's verifier: best-of-n by the verifier. With a
    verifier that checks against the gold answer this is the oracle, pass@b; with one that does not
    (unit tests a program must pass, a format check) it is a real selection."""
    if group.rewards is None:
        raise ValueError(f"verifier_scores: the group of problem {group.problem.id!r} is not scored; score it first")
    return list(group.rewards)


def _mean_logprob(completion: Completion) -> float:
    return sum(completion.logprobs) / max(len(completion.logprobs), 1)


def task_metrics(groups: Sequence[Group], settings: EvalSettings,
                 score_fn: Callable[[Group], Sequence[float]]) -> dict[str, Any]:
    """pass@k / maj@k / mean@k (each with a 95% bootstrap interval over problems), length,
    truncation, reward checks stopped at their time bound, per-difficulty accuracy and test-time
    scaling curves of scored groups."""
    pools, cut = zip(*(_samples(group, score_fn) for group in groups)) if groups else ((), ())
    metrics: dict[str, Any] = {"problems": len(groups)}
    completions = [c for g in groups for c in g.completions]
    for k in settings.ks:
        for name, per_problem in (
            (f"pass@{k}", [pass_at_k(len(p), sum(s.correct for s in p), k) for p in pools]),
            (f"maj@{k}", [maj_at_k([s.answer for s in p], [s.correct for s in p], k) for p in pools]),
            (f"mean@{k}", [mean_at_k(len(p), sum(s.correct for s in p), k) for p in pools]),
        ):
            low, high = bootstrap_ci(per_problem)
            metrics[name] = {"value": sum(per_problem) / len(per_problem), "ci95": [low, high]}
    metrics["reward_mean"] = sum(r for g in groups for r in g.rewards or ()) / len(completions)
    metrics["length_mean"] = sum(_generated_tokens(c) for c in completions) / len(completions)
    metrics["truncated_frac"] = sum(c.finish_reason == "length" for c in completions) / len(completions)
    # Checks stopped at their time bound score 0 (as in training's eval/<mode>_timeouts): a wrong answer or not.
    metrics["timeouts"] = sum(g.reward_timeouts for g in groups)
    # Problems whose answers maj@k and the scaling curves compare ran past their budget: the rest compared as text.
    metrics["vote_timeouts"] = sum(cut)
    metrics["by_difficulty"] = _by_difficulty(groups, pools)
    metrics["tts"] = {method: scaling_curve(pools, method, settings.budgets or settings.ks)
                      for method in settings.pool_methods}
    others = sorted({name for g in groups for name in g.reward_components} - {"correct"})
    if others:  # e.g. an agent's tool/valid, tool/invalid, tool/turns
        metrics["components"] = {name: sum(v for g in groups for v in g.reward_components[name]) / len(completions)
                                 for name in others}
    return metrics


def _generated_tokens(completion: Completion) -> int:
    """The tokens the model wrote (an episode's inserted observations not counted)."""
    mask = completion.loss_mask
    return len(completion.token_ids) if mask is None else sum(mask)


def _samples(group: Group, score_fn: Callable[[Group], Sequence[float]],
             weights: Sequence[float] | None = None) -> tuple[list[Sample], bool]:
    """One problem's completions as test-time scaling sees them; equal answers (math_equal) share a
    cluster id. A vote weighs `weights[i]`, by default the completion's confidence exp(mean log-prob).
    With them, whether a comparison of its answers was stopped at its time bound (`answer_clusters`)."""
    correct = group.solved
    answers: list[str | None] = [extract_answer(c.text) for c in group.completions]
    cluster_of: dict[int, int] = {}
    stopped_before = timeouts_on_this_thread()
    clusters = answer_clusters(answers)
    cut = timeouts_on_this_thread() > stopped_before
    for cluster_id, members in enumerate(clusters):
        for index in members:
            cluster_of[index] = cluster_id
    scores = list(score_fn(group))
    if len(scores) != group.size:
        raise ValueError(f"the best-of-n scorer gave {len(scores)} scores for the {group.size} completions of problem "
                         f"{group.problem.id!r}")
    if weights is None:
        weights = [math.exp(_mean_logprob(c)) for c in group.completions]
    return [Sample(answer=cluster_of.get(i), correct=correct[i], score=scores[i], weight=weights[i],
                   tokens=len(c.token_ids)) for i, c in enumerate(group.completions)], cut


def beam_curves(generator: StepGenerator, prm: StepScorer, task: str, problems: Sequence[Problem],
                reward: WeightedReward, settings: EvalSettings, cache: BeamCache, *,
                progress: bool = True) -> dict[str, list[dict[str, float]]]:
    """Accuracy of PRM-guided beam search at each number of beams N in settings.budgets, one curve
    per search method asked for, each row with the compute spent: "samples" (N solutions),
    "tokens" (mean generated tokens per problem, pruned candidates included), "step_samples"
    (mean steps sampled per problem) and "rounds" (mean search rounds)."""
    curves: dict[str, list[dict[str, float]]] = {method: [] for method in settings.search_methods}
    bar = tqdm(total=len(problems) * len(settings.budgets), desc=f"beam {task}", unit="problem", disable=not progress)
    for beams in settings.budgets:
        found = _search_cached(generator, prm, task, problems, settings, beams, cache, bar)
        groups = score_groups([Group(problem=r.problem, prompt_ids=(), completions=tuple(b.completion() for b in
                                                                                          r.solutions))
                               for r in found], reward)
        pooled = [_samples(group, lambda g, r=r: [b.score for b in r.solutions], [b.score for b in r.solutions])
                  for group, r in zip(groups, found)]
        pools, vote_timeouts = [pool for pool, _ in pooled], float(sum(cut for _, cut in pooled))
        cost = {"samples": float(beams), "tokens": _mean([r.tokens for r in found]),
                "step_samples": _mean([r.samples for r in found]), "rounds": _mean([r.rounds for r in found])}
        for method in settings.search_methods:
            credits = [SEARCH_METHODS[method](pool, range(len(pool))) for pool in pools]
            curves[method].append({"budget": float(beams), "accuracy": _mean(credits), **cost,
                                   "vote_timeouts": vote_timeouts})
    bar.close()
    return curves


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _search_cached(generator: StepGenerator, prm: StepScorer, task: str, problems: Sequence[Problem],
                   settings: EvalSettings, beams: int, cache: BeamCache, bar: tqdm) -> list[BeamResult]:
    """Every problem's search with `beams` beams, in chunks as `_generate_cached` samples (a chunk
    found whole in the cache is not searched again; a chunk's seed depends on its first problem)."""
    key = settings.beam_key(beams, cache.model_key)
    found: list[BeamResult] = []
    for start in range(0, len(problems), BEAM_CHUNK):
        chunk = problems[start : start + BEAM_CHUNK]
        cached = [cache.get(task, key, problem) for problem in chunk]
        if all(result is not None for result in cached):
            found.extend(cached)  # type: ignore[arg-type]
        else:
            digest = hashlib.sha256(f"{settings.seed}/{task}/{chunk[0].id}/beam{beams}".encode()).hexdigest()
            searched = beam_search(generator, prm, chunk, settings.beam_config(beams), seed=int(digest[:12], 16))
            for result in searched:
                cache.put(task, key, result)
            found.extend(searched)
        bar.update(len(chunk))
    return found


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
        if m.get("components"):
            lines.append(f"\n{task}, per completion: " + ", ".join(f"{name} {value:.3f}"
                                                                 for name, value in m["components"].items()))
        for method, rows in m["tts"].items():
            lines.append(f"\n{task}, {method}: " + ", ".join(
                f"b={int(r['budget'])}: {r['accuracy']:.3f} ({r['tokens']:.0f} tokens)" for r in rows))
    return "\n".join(lines) + "\n"


def _generate_cached(engine: RolloutEngine, task: str, problems: Sequence[Problem], settings: EvalSettings,
                     cache: CompletionCache, bar: tqdm) -> list[Group]:
    """Every problem's group, generated in fixed chunks of the problem list (a chunk found whole in
    the cache is not generated again). A chunk's seed depends on its first problem, so a resumed
    evaluation samples exactly what a straight one would have."""
    sampling = SamplingParams(n=settings.n, temperature=settings.temperature, top_p=settings.top_p,
                              top_k=settings.top_k, max_new_tokens=settings.max_new_tokens, stop=settings.stop)
    groups: list[Group] = []
    for start in range(0, len(problems), settings.problems_per_chunk):
        chunk = problems[start : start + settings.problems_per_chunk]
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
