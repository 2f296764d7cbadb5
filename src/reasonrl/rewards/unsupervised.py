"""Label-free rewards: scores that need no gold answer (`Problem.answer` is never read).

- `MajorityVoteReward`: the group's most common answer is the pseudo-label (Zuo et al. 2025,
  "TTRL: Test-Time Reinforcement Learning").
- `SelfCertaintyReward`: how far the model's next-token distributions are from uniform (Kang et al.
  2025, "Scalable Best-of-N Selection for Large Language Models via Self-Certainty"; the reward of
  INTUITOR, Zhao et al. 2025, "Learning to Reason without External Rewards"), or minus their
  entropy (Agarwal et al. 2025, "The Unreasonable Effectiveness of Entropy Minimization in LLM
  Reasoning", EM-RL-token). Both need the full distributions: one no-grad forward per group.
- `SequenceLogProbReward`: the sampled tokens' log-probabilities (Agarwal et al. 2025,
  EM-RL-sequence), read from `Completion.logprobs` without a forward pass.

These rewards reward the model for agreeing with itself; they can collapse onto a confident wrong
answer, so watch a labelled metric while training with them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from reasonrl.rewards.answers import EXTRACTORS
from reasonrl.rewards.bounded import count_stopped
from reasonrl.rewards.equivalence import CHECK_TIMEOUT_S, math_equal
from reasonrl.rewards.shaping import completion_length
from reasonrl.spec import declare
from reasonrl.types import Completion, Problem

Reduction = Literal["mean", "sum"]


# The symbolic checks of one group's answers take at most this long together. Each check is bounded
# (CHECK_TIMEOUT_S), but G answers that all differ take G(G-1)/2 of them: 16 hostile answers could
# hold the trainer 10 minutes.
CLUSTER_BUDGET_S = 4 * CHECK_TIMEOUT_S
MIN_CHECK_S = 0.1  # less than this left of the budget: no symbolic check (it would time out, not decide)


def answer_clusters(answers: Sequence[str | None], *, budget_s: float = CLUSTER_BUDGET_S) -> list[list[int]]:
    """Indices of equal answers, grouped: answers[i] joins the first cluster whose first answer it
    equals (`math_equal`, so "0.5" and "\\frac{1}{2}" share one), else starts a new one. Clusters
    come in the order their first answer appears; None (no answer) joins none. The symbolic checks
    share `budget_s` seconds (each gets at most what is left); once it is spent, answers are
    compared as strings only, and the group counts once in `timeouts_on_this_thread` (reward/timeouts),
    besides a check cut at what was left of the budget, which counts itself.
    Only then do the clusters depend on the machine's speed: answers that need a symbolic check to
    agree (0.5 and 1/2) can land in different clusters on a slower one."""
    deadline = time.monotonic() + budget_s
    clusters: list[list[int]] = []
    spent = False
    for index, answer in enumerate(answers):
        if answer is None:
            continue
        for cluster in clusters:
            first = answers[cluster[0]]
            left = deadline - time.monotonic()
            if answer != first and left < MIN_CHECK_S and not spent:
                spent = True
                count_stopped(f"majority vote: the symbolic checks of a group of {len(answers)} answers took its "
                              f"{budget_s:g} s; the rest are compared as text")
            if answer == first or (left >= MIN_CHECK_S and math_equal(answer, first, timeout_s=min(CHECK_TIMEOUT_S, left))):
                cluster.append(index)
                break
        else:
            clusters.append([index])
    return clusters


@declare(context={"extract": "reward.extract"})
@dataclass(frozen=True)
class MajorityVoteReward:
    """TTRL's majority-vote reward (Zuo et al. 2025): within a group, the most common extracted
    answer is the pseudo-label y*, and

        y* = argmax_y sum_i 1[a_i = y],        r_i = 1 if a_i = y* else 0

    where a_i is completion i's answer (extractor `extract`, a key of `EXTRACTORS`) and "=" is
    `math_equal`. A completion without an answer does not vote and scores 0. Ties go to the answer
    that appears first in the group, as in the TTRL code (`Counter.most_common` keeps first-seen
    order among equal counts); the engine's completion order is the sampling order, so this is an
    arbitrary but reproducible pick (while the group's checks fit in `answer_clusters`' budget). With `min_agreement` > 0, a group whose majority holds less
    than that share of all its completions (TTRL's "majority ratio") gets no label: every
    completion scores 0.
    """

    extract: str = "auto"
    min_agreement: float = 0.0

    def __post_init__(self) -> None:
        if self.extract not in EXTRACTORS:
            raise ValueError(f"MajorityVoteReward: unknown extract {self.extract!r}; allowed: {sorted(EXTRACTORS)}")
        if not 0.0 <= self.min_agreement <= 1.0:
            raise ValueError(f"MajorityVoteReward: min_agreement must be in [0, 1], got {self.min_agreement}")

    def majority(self, completions: Sequence[Completion]) -> list[int]:
        """Indices of the completions that agree with the pseudo-label; empty when there is none."""
        clusters = answer_clusters([EXTRACTORS[self.extract](c.text) for c in completions])
        if not clusters:
            return []
        largest = max(clusters, key=len)  # max keeps the first of equal lengths: the earliest answer
        return largest if len(largest) >= self.min_agreement * len(completions) else []

    def score_group(self, problem: Problem, completions: Sequence[Completion]) -> list[float]:
        agreeing = set(self.majority(completions))
        return [1.0 if g in agreeing else 0.0 for g in range(len(completions))]


def token_certainty(logits_TV: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position t, with p_t = softmax(logits_TV[t]) over V entries, in float32:
    self-certainty KL(U || p_t) = -log V - (1/V) sum_j log p_t(j), and entropy
    H(p_t) = -sum_j p_t(j) log p_t(j). Both are 0 / log V for a uniform p_t."""
    logp_TV = torch.log_softmax(logits_TV.float(), dim=-1)
    self_certainty_T = -math.log(logp_TV.shape[-1]) - logp_TV.mean(dim=-1)
    entropy_T = torch.special.entr(logp_TV.exp()).sum(dim=-1)
    return self_certainty_T, entropy_T


def _reduce(values_T: torch.Tensor, reduction: Reduction) -> float:
    return float(values_T.mean() if reduction == "mean" else values_T.sum())


def _check_reduction(name: str, reduction: str) -> None:
    if reduction not in ("mean", "sum"):
        raise ValueError(f"{name}: reduction must be 'mean' or 'sum', got {reduction!r}")


def _nonempty_length(completion: Completion, name: str) -> int:
    length = completion_length(completion, name)
    if length == 0:
        raise ValueError(f"{name}: a completion has no tokens, so there is nothing to measure")
    return length


@dataclass(frozen=True)
class SelfCertaintyReward:
    """A confidence reward computed from the model's full next-token distributions p_t over the
    completion's tokens t = 1..n (one no-grad forward of prompt + completions per group; logits
    upcast to float32, then divided by `temperature`).

    measure="self_certainty" (Kang et al. 2025; INTUITOR, Zhao et al. 2025):
        (1/n) sum_t KL(U || p_t) = -(1/(nV)) sum_t sum_j log(V p_t(j))
    measure="neg_entropy" (Agarwal et al. 2025, EM-RL-token): -(1/n) sum_t H(p_t).

    V is the width of the model's output layer. INTUITOR's released code computes logsumexp(z) -
    mean(z), i.e. without the constant -log V, which does not change group-normalised advantages.
    `reduction="sum"` replaces the mean over tokens by the sum: EM-RL sums, but then every token adds
    a term <= 0 and short completions win; the mean (default) is Kang et al.'s and INTUITOR's.

    `model` is a causal LM returning `.logits` (pass the policy itself for INTUITOR, or a frozen
    copy); it is switched to eval mode for the forward and back. A group reward sees the problem
    but not the prompt's token ids, so `prompt_ids_fn(problem)` must give the exact ids the engine
    generated from: the HF engine's `engine.prompt_ids`, or
    `functools.partial(rollout.base.prompt_token_ids, tokenizer, chat_template=True)`. Set
    `temperature` to the sampling temperature to measure the distribution that was sampled.
    """

    model: torch.nn.Module = field(repr=False)
    prompt_ids_fn: Callable[[Problem], Sequence[int]] = field(repr=False)
    measure: Literal["self_certainty", "neg_entropy"] = "self_certainty"
    reduction: Reduction = "mean"
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.measure not in ("self_certainty", "neg_entropy"):
            raise ValueError(f"SelfCertaintyReward: measure must be 'self_certainty' or 'neg_entropy', "
                             f"got {self.measure!r}")
        _check_reduction("SelfCertaintyReward", self.reduction)
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"SelfCertaintyReward: temperature must be > 0, got {self.temperature}")

    def score_group(self, problem: Problem, completions: Sequence[Completion]) -> list[float]:
        prompt = list(self.prompt_ids_fn(problem))
        if not prompt:
            raise ValueError(f"SelfCertaintyReward: prompt_ids_fn gave no token ids for problem {problem.id!r}; "
                             "the first completion token needs a prompt token (e.g. BOS) to be predicted from")
        lengths = [_nonempty_length(c, "SelfCertaintyReward") for c in completions]
        logits_NLV = self._logits(prompt, completions)
        scores = []
        start = len(prompt) - 1  # the logits at position i predict token i + 1
        for n, length in enumerate(lengths):
            logits_TV = logits_NLV[n, start : start + length].float() / self.temperature
            self_certainty_T, entropy_T = token_certainty(logits_TV)
            per_token_T = self_certainty_T if self.measure == "self_certainty" else -entropy_T
            scores.append(_reduce(per_token_T, self.reduction))
        return scores

    @torch.no_grad()
    def _logits(self, prompt: list[int], completions: Sequence[Completion]) -> torch.Tensor:
        rows = [prompt + list(c.token_ids) for c in completions]
        width = max(len(row) for row in rows)
        # Right padding: with causal attention no real position sees the pads.
        input_ids_NL = torch.zeros((len(rows), width), dtype=torch.long)
        attention_mask_NL = torch.zeros((len(rows), width), dtype=torch.long)
        for n, row in enumerate(rows):
            input_ids_NL[n, : len(row)] = torch.tensor(row, dtype=torch.long)
            attention_mask_NL[n, : len(row)] = 1
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        try:
            return self.model(input_ids=input_ids_NL.to(device), attention_mask=attention_mask_NL.to(device)).logits
        finally:
            self.model.train(was_training)


@dataclass(frozen=True)
class SequenceLogProbReward:
    """Agarwal et al. 2025's EM-RL-sequence reward: the sampled tokens' log-probabilities
    (`Completion.logprobs`, under the sampling distribution), no forward pass needed.

        reduction="sum":  sum_t log pi(y_t | x, y_<t) = log pi(y | x), an unbiased estimate of
                          minus the sequence entropy, since E_y[log pi(y | x)] = -H(pi(. | x)) (the paper)
        reduction="mean": the same divided by the completion's length (default), so that the reward
                          does not simply favour short completions
    """

    reduction: Reduction = "mean"

    def __post_init__(self) -> None:
        _check_reduction("SequenceLogProbReward", self.reduction)

    def score(self, completion: Completion) -> float:
        if not completion.logprobs or len(completion.logprobs) != len(completion.token_ids):
            raise ValueError(f"SequenceLogProbReward needs one sampling log-probability per completion token; got "
                             f"{len(completion.logprobs)} for {len(completion.token_ids)} tokens (a completion scored "
                             "from its text alone has none; score the groups a rollout engine returns)")
        total = math.fsum(completion.logprobs)
        return total / len(completion.logprobs) if self.reduction == "mean" else total

    def score_group(self, problem: Problem, completions: Sequence[Completion]) -> list[float]:
        return [self.score(c) for c in completions]
