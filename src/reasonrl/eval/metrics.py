"""Sample-based accuracy metrics of the literature, per problem, and bootstrap intervals over problems.

- `pass_at_k(n, c, k)`: the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language
  Models Trained on Code", eq. 1): with n samples of which c are correct,
  pass@k = 1 - C(n - c, k) / C(n, k), the chance that k samples drawn without replacement contain
  a correct one; computed as 1 - prod_{i = n-c+1}^{n} (1 - k / i), which never forms the large
  binomials.
- `maj_at_k(answers, correct, k)`: majority voting (self-consistency, Wang et al. 2023) over k of
  the n samples, averaged over k-subsets: every subset when there are at most `max_subsets` of
  them, else `max_subsets` random ones (seeded). A tie between answers gives the share of the tied
  answers that are correct, so no tie-break order favours either. Samples without an answer
  (None) do not vote; a subset with no answer scores 0.
- `mean_at_k`: mean accuracy of the samples (avg@k), c / n: the expectation of the accuracy of k
  samples for any k <= n.
- `bootstrap_ci(values)`: percentile bootstrap (Efron 1979) of the mean over problems.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Sequence

from reasonrl.eval.tts import Sample, expected_credit, majority


def _check_k(n: int, k: int) -> None:
    if n < 1 or not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n samples, got n={n}, k={k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021)."""
    _check_k(n, k)
    if not 0 <= c <= n:
        raise ValueError(f"correct count c={c} must be in [0, n={n}]")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_at_k(n: int, c: int, k: int) -> float:
    """Expected accuracy of k samples: c / n (does not depend on k)."""
    _check_k(n, k)
    return c / n


def maj_at_k(answers: Sequence[Hashable | None], correct: Sequence[bool], k: int, *, max_subsets: int = 2000,
             seed: int = 0) -> float:
    """Majority-vote accuracy over k of the samples (see the module docstring).

    `answers[i]` is sample i's normalised answer (equal answers must compare equal), `correct[i]`
    whether it is right.
    """
    if len(correct) != len(answers):
        raise ValueError(f"{len(answers)} answers but {len(correct)} correctness flags")
    _check_k(len(answers), k)
    samples = [Sample(answer, bool(right)) for answer, right in zip(answers, correct)]
    return expected_credit(samples, k, majority, max_subsets=max_subsets, seed=seed)


def bootstrap_ci(values: Sequence[float], *, confidence: float = 0.95, resamples: int = 2000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` (one value per problem)."""
    if not values:
        raise ValueError("bootstrap_ci: no values")
    if not 0 < confidence < 1:
        raise ValueError(f"bootstrap_ci: confidence must be in (0, 1), got {confidence}")
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    tail = (1 - confidence) / 2
    low = means[min(resamples - 1, max(0, math.floor(tail * resamples)))]
    high = means[min(resamples - 1, max(0, math.ceil((1 - tail) * resamples) - 1))]
    return low, high
