"""Adaptive rollout budget: more samples for the problems the policy still gets wrong, fewer for
the ones it has solved, under a fixed total number of completions per step.

The motivation is Knapsack RL (Li et al. 2025, "Knapsack RL: Unlocking Exploration of LLMs via
Optimizing Budget Allocation"): a uniform G wastes samples on problems whose groups all agree
(zero advantage) and starves hard problems whose rare successes carry the signal. Knapsack RL
solves an optimisation over estimated gradient value; the rule here is the simple, documented
heuristic of giving each problem a share proportional to its running failure rate,

    weight_i = max(1 - pass_rate_i, floor)   (pass_rate_i unknown: 0.5)
    n_i      = min_samples + the largest-remainder share of (total - P * min_samples) by weight_i

so the counts always sum to `total`, every problem gets at least `min_samples` (2: a group of one
has no spread to learn from), and a solved problem (pass rate 1) still gets its floor share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from reasonrl.types import Group, Problem, RolloutEngine, SamplingParams


def allocate_samples(pass_rates: Sequence[float | None], total: int, *, min_samples: int = 2,
                     floor: float = 0.1) -> list[int]:
    """Completions per problem, summing to `total` (see the module docstring for the rule)."""
    count = len(pass_rates)
    if count == 0:
        raise ValueError("allocate_samples: no problems")
    if total < count * min_samples:
        raise ValueError(f"allocate_samples: a budget of {total} cannot give {count} problems {min_samples} each")
    weights = [max(1.0 - (0.5 if rate is None else rate), floor) for rate in pass_rates]
    spare = total - count * min_samples
    shares = [spare * w / sum(weights) for w in weights]
    counts = [min_samples + math.floor(share) for share in shares]
    # Largest remainder first; ties to the earlier problem, so the allocation is deterministic.
    by_remainder = sorted(range(count), key=lambda i: (-(shares[i] - math.floor(shares[i])), i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def generate_with_budget(engine: RolloutEngine, problems: Sequence[Problem], sampling: SamplingParams,
                         counts: Sequence[int]) -> list[Group]:
    """Groups of `counts[i]` completions for `problems[i]`, in problem order: one engine call per
    distinct count (each with its own seed derived from `sampling.seed`)."""
    positions_by_count: dict[int, list[int]] = {}
    for position, count in enumerate(counts):
        positions_by_count.setdefault(count, []).append(position)
    groups: list[Group | None] = [None] * len(problems)
    for count, positions in sorted(positions_by_count.items()):
        generated = engine.generate([problems[i] for i in positions], replace(sampling, n=count, seed=sampling.seed + count))
        for position, group in zip(positions, generated):
            groups[position] = group
    return groups  # type: ignore[return-value]  # every position was filled
