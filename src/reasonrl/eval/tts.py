"""Test-time scaling from a pool of samples: which of b samples a method picks, and its accuracy as
the budget b grows (the accuracy-vs-compute curve).

Each method is a selector: given the samples of one problem (answer, correctness, score, weight)
and a subset of b of them, the credit of the answer it picks, in [0, 1] (a tie between answers gives
the share of the tied ones that are correct). A method's accuracy at budget b is the mean credit over
b-subsets of the n samples drawn (every subset when there are few, else a seeded random sample of
them), averaged over problems: an unbiased estimate of "b fresh samples" without generating per b.

- `majority`: self-consistency (Wang et al. 2023), the most common answer.
- `weighted_majority`: answers weighted by a per-sample weight, e.g. a confidence exp(mean token
  log-prob) (confidence-weighted self-consistency; Kang et al. 2025 vote by self-certainty) or a
  reward model's score (Li et al. 2023, "Making Language Models Better Reasoners with
  Step-Aware Verifier", weighted voting).
- `best_of_n`: the sample with the highest verifier or reward-model score (Cobbe et al. 2021,
  "Training Verifiers to Solve Math Word Problems").
- `pass`: pass@b, the oracle upper bound (any sample correct).

Compute is reported in samples (b) and in generated tokens (b times the mean completion length).
PRM-guided step-level beam search generates its own samples per budget: `eval.search`.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    """One sampled solution, as test-time scaling sees it."""

    answer: Hashable | None  # normalised final answer; None: no answer found
    correct: bool
    score: float = 0.0  # verifier / reward model score (best_of_n)
    weight: float = 1.0  # vote weight (weighted_majority)
    tokens: int = 0


Selector = Callable[[Sequence[Sample], Sequence[int]], float]


def _credit(samples: Sequence[Sample], subset: Sequence[int], totals: dict[Hashable, float]) -> float:
    """Credit of picking the answers with the highest total: the share of them that are correct."""
    if not totals:
        return 0.0
    top = max(totals.values())
    winners = [answer for answer, total in totals.items() if math.isclose(total, top, rel_tol=1e-12, abs_tol=1e-12)]
    correct = {samples[i].answer for i in subset if samples[i].correct and samples[i].answer is not None}
    return sum(answer in correct for answer in winners) / len(winners)


def majority(samples: Sequence[Sample], subset: Sequence[int]) -> float:
    totals: dict[Hashable, float] = defaultdict(float)
    for i in subset:
        if samples[i].answer is not None:
            totals[samples[i].answer] += 1.0
    return _credit(samples, subset, totals)


def weighted_majority(samples: Sequence[Sample], subset: Sequence[int]) -> float:
    totals: dict[Hashable, float] = defaultdict(float)
    for i in subset:
        if samples[i].answer is not None:
            totals[samples[i].answer] += samples[i].weight
    return _credit(samples, subset, totals)


def best_of_n(samples: Sequence[Sample], subset: Sequence[int]) -> float:
    best = max(samples[i].score for i in subset)
    tied = [i for i in subset if math.isclose(samples[i].score, best, rel_tol=1e-12, abs_tol=1e-12)]
    return sum(samples[i].correct for i in tied) / len(tied)


def oracle(samples: Sequence[Sample], subset: Sequence[int]) -> float:
    return float(any(samples[i].correct for i in subset))


METHODS: dict[str, Selector] = {
    "majority": majority,
    "weighted_majority": weighted_majority,
    "best_of_n": best_of_n,
    "pass": oracle,
}


def expected_credit(samples: Sequence[Sample], budget: int, selector: Selector, *, max_subsets: int = 500,
                    seed: int = 0) -> float:
    """Mean credit of `selector` over `budget`-subsets of the samples (all of them if few enough)."""
    n = len(samples)
    if not 1 <= budget <= n:
        raise ValueError(f"budget {budget} must be between 1 and the {n} samples drawn")
    if math.comb(n, budget) <= max_subsets:
        subsets: Sequence[Sequence[int]] = list(itertools.combinations(range(n), budget))
    else:
        rng = random.Random(seed)
        subsets = [rng.sample(range(n), budget) for _ in range(max_subsets)]
    return sum(selector(samples, subset) for subset in subsets) / len(subsets)


def scaling_curve(problems: Sequence[Sequence[Sample]], method: str, budgets: Sequence[int], *,
                  max_subsets: int = 500, seed: int = 0) -> list[dict[str, float]]:
    """Accuracy of `method` at each budget, with the compute it costs: one row per budget with
    "budget", "accuracy", "samples" (completions drawn: the budget) and "tokens" (mean generated
    tokens per problem at that budget)."""
    if method not in METHODS:
        raise ValueError(f"unknown test-time scaling method {method!r}; known: {', '.join(METHODS)}")
    if not problems:
        raise ValueError("scaling_curve: no problems")
    mean_tokens = sum(s.tokens for samples in problems for s in samples) / sum(len(samples) for samples in problems)
    rows = []
    for budget in budgets:
        credits = [expected_credit(samples, budget, METHODS[method], max_subsets=max_subsets, seed=seed + index)
                   for index, samples in enumerate(problems)]
        rows.append({"budget": float(budget), "accuracy": sum(credits) / len(credits), "samples": float(budget),
                     "tokens": budget * mean_tokens})
    return rows
