"""Benchmark contamination check: which benchmark problems share a word 13-gram with the training
problems, and the training set without the problems that leak them.

Follows the n-gram overlap test of GPT-3 (Brown et al. 2020, "Language Models are Few-Shot
Learners", appendix C), also used for the Llama models: texts are normalised (Unicode NFKC,
lowercase, punctuation removed, whitespace collapsed) and split into words; a benchmark problem is
contaminated when any of its word n-grams (n = 13) occurs in a training problem. Deviation: GPT-3
shrinks n for datasets of short examples; here a benchmark problem shorter than n words is instead
contaminated when its whole word sequence occurs in a training problem, so short exact copies are
still caught.

Only prompt texts are compared (chat prompts by their messages' contents). A prompt template of n
or more words shared by both sets would match everything: pass `text=` a function returning the
bare question in that case.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from reasonrl.tasks.base import prompt_text
from reasonrl.types import Problem

_NOT_WORD = re.compile(r"[^\w\s]|_")


def normalized_words(text: str) -> list[str]:
    """`text` as lowercase words without punctuation: "Janet's ducks, 16!" -> ["janet", "s", "ducks", "16"]."""
    return _NOT_WORD.sub(" ", unicodedata.normalize("NFKC", text).lower()).split()


def normalized_text(text: str) -> str:
    """`text` normalised as for the n-gram check, its words joined by single spaces."""
    return " ".join(normalized_words(text))


@dataclass(frozen=True)
class ContaminationReport:
    """Result of `ngram_overlap`: `contaminated_ids` are the benchmark problems with an n-gram seen in
    training (`fraction` of the `benchmark_size`), `train_ids` the training problems they were seen in."""

    n: int
    benchmark_size: int
    contaminated_ids: tuple[str, ...]
    train_ids: tuple[str, ...]

    @property
    def fraction(self) -> float:
        return len(self.contaminated_ids) / self.benchmark_size if self.benchmark_size else 0.0


def ngram_overlap(train_problems: Sequence[Problem], benchmark_problems: Sequence[Problem], n: int = 13, *,
                  text: Callable[[Problem], str] = prompt_text) -> ContaminationReport:
    """Which benchmark problems share a normalised word `n`-gram with a training problem (ids in input order)."""
    contaminated, leaking = _overlap(train_problems, benchmark_problems, n, text)
    return ContaminationReport(n=n, benchmark_size=len(benchmark_problems),
                               contaminated_ids=tuple(benchmark_problems[b].id for b in sorted(contaminated)),
                               train_ids=tuple(train_problems[t].id for t in leaking))


def decontaminate(train_problems: Sequence[Problem], benchmark_problems: Sequence[Problem], n: int = 13, *,
                  text: Callable[[Problem], str] = prompt_text) -> list[Problem]:
    """The training problems that share no normalised word `n`-gram with any benchmark problem."""
    _, leaking = _overlap(train_problems, benchmark_problems, n, text)
    dropped = set(leaking)
    return [problem for t, problem in enumerate(train_problems) if t not in dropped]


def _overlap(train_problems: Sequence[Problem], benchmark_problems: Sequence[Problem], n: int,
             text: Callable[[Problem], str]) -> tuple[set[int], list[int]]:
    """(indices of the contaminated benchmark problems, indices of the training problems holding their n-grams)."""
    if n < 1:
        raise ValueError(f"n-gram overlap: n must be at least 1, got {n}")
    owners: dict[tuple[str, ...], list[int]] = {}  # benchmark n-gram -> indices of the benchmark problems holding it
    short: list[tuple[int, str]] = []  # benchmark problems under n words, as " w1 w2 ... " for a containment test
    for b, problem in enumerate(benchmark_problems):
        words = normalized_words(text(problem))
        if len(words) >= n:
            for gram in {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}:
                owners.setdefault(gram, []).append(b)
        elif words:
            short.append((b, f" {' '.join(words)} "))
    contaminated: set[int] = set()
    leaking: list[int] = []
    for t, problem in enumerate(train_problems):
        words = normalized_words(text(problem))
        hits = {b for i in range(len(words) - n + 1) for b in owners.get(tuple(words[i : i + n]), ())}
        padded = f" {' '.join(words)} "
        hits.update(b for b, sequence in short if sequence in padded)
        if hits:
            contaminated |= hits
            leaking.append(t)
    return contaminated, leaking
