"""The generation budget in force at a step (rollout.max_new_tokens, or a stage's) travels with the
step's groups and batch: Dr. GRPO's constant normaliser and the length rewards measure against the
budget the completions were sampled under, stage by stage, not a number fixed when the run was built."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from helpers import TASK, share_of_a, tiny_config

from reasonrl import train
from reasonrl.algo.aggregation import seq_mean_token_sum_norm
from reasonrl.rewards import SoftOverlongPunishment
from reasonrl.spec import declare
from reasonrl.types import Completion, Problem

NORMALISED_BY: list[int] = []
MEASURED_AGAINST: list[int] = []


@declare(inputs=("max_tokens",))
def recorded_norm(loss_NT: torch.Tensor, mask_NT: torch.Tensor, *, total_tokens: float, total_sequences: float,
                  max_tokens: int) -> torch.Tensor:
    """Dr. GRPO's aggregation, noting the budget it normalises by."""
    NORMALISED_BY.append(max_tokens)
    return seq_mean_token_sum_norm(loss_NT, mask_NT, total_tokens=total_tokens, total_sequences=total_sequences,
                                   max_tokens=max_tokens)


@declare(inputs=("max_new_tokens",))
class RecordedOverlong:
    """DAPO's overlong punishment without a length of its own, noting the budget it measures against."""

    def __init__(self) -> None:
        self.punishment = SoftOverlongPunishment(max_length=None, cache_length=2)

    def score_group(self, problem: Problem, completions: Sequence[Completion], *,
                    max_new_tokens: int | None = None) -> list[float]:
        MEASURED_AGAINST.append(max_new_tokens)
        return self.punishment.score_group(problem, completions, max_new_tokens=max_new_tokens)


def test_stages_change_the_budget_the_normaliser_and_the_length_reward_use(tiny_model_dir, tmp_path):
    NORMALISED_BY.clear()
    MEASURED_AGAINST.clear()
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", "train.steps=4", "algo.advantage=dr_grpo",
                      f"algo.aggregation={__name__}:recorded_norm", "rollout.max_new_tokens=6",
                      "sampling.stages=['2: max_new_tokens=3']")
    train(cfg, task=TASK, reward={"a": (share_of_a, 1.0), "overlong": (RecordedOverlong(), 0.5)})
    # one optimizer step of one micro-batch per step; a score per group (4 per step)
    assert NORMALISED_BY == [6, 6, 3, 3]
    assert MEASURED_AGAINST == [6] * 8 + [3] * 8


def test_the_punishment_follows_the_budget_it_is_given():
    punishment = SoftOverlongPunishment(max_length=None, cache_length=2)
    completion = Completion(token_ids=(1, 2, 3), text="abc", logprobs=(0.0, 0.0, 0.0), finish_reason="stop")
    problem = Problem(id="p", prompt="q", answer="a")
    # 3 tokens: inside the buffer of a budget of 4 (expected 2: (2 - 3) / 2), past a budget of 2 (-1),
    # before the buffer of a budget of 8 (0); a length of its own is the fallback
    assert punishment.score_group(problem, [completion], max_new_tokens=4) == [-0.5]
    assert punishment.score_group(problem, [completion], max_new_tokens=2) == [-1.0]
    assert SoftOverlongPunishment(max_length=8, cache_length=2).score_group(problem, [completion]) == [0.0]
    assert SoftOverlongPunishment(max_length=8, cache_length=2).score_group(problem, [completion],
                                                                         max_new_tokens=4) == [-0.5]
