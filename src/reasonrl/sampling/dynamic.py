"""Dynamic sampling (Yu et al. 2025, "DAPO", section 3.2): keep only groups that teach something.

A group whose completions all got the same reward has zero group-relative advantage: it costs a
rollout and moves nothing but the loss's denominator. DAPO over-samples and filters them out,
generating more problems until the batch is full of informative groups. Here generation goes in
rounds: each round draws as many new problems as are still missing, and after `max_rounds`
rounds the step trains on what it has (counted in `sampling/short_groups`), so a task the policy
has fully solved or cannot solve at all slows a step down by a bounded factor, never forever.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from reasonrl.types import Group, Problem


def has_reward_spread(group: Group) -> bool:
    """Whether the group's total rewards are not all equal (DAPO: 0 < accuracy < 1)."""
    return max(group.rewards) > min(group.rewards)


def fill_batch(draw: Callable[[int], Sequence[Problem]], rollout: Callable[[Sequence[Problem], int], list[Group]],
               target: int, *, max_rounds: int, keep: Callable[[Group], bool] = has_reward_spread,
               ) -> tuple[list[Group], dict[str, float]]:
    """Up to `target` scored groups that `keep` accepts, from at most `max_rounds` rounds of
    `rollout(draw(missing), round)`; and metrics of how many rounds and dropped groups it took.

    When no round yields a kept group, the last round's groups are returned as they are, so that
    the step still runs (with zero advantages) and its metrics are logged.
    """
    if target < 1 or max_rounds < 1:
        raise ValueError(f"fill_batch: target={target} and max_rounds={max_rounds} must be >= 1")
    kept: list[Group] = []
    dropped = rounds = 0
    last: list[Group] = []
    while len(kept) < target and rounds < max_rounds:
        last = rollout(draw(target - len(kept)), rounds)
        rounds += 1
        for group in last:
            if keep(group):
                kept.append(group)
            else:
                dropped += 1
    metrics = {"sampling/rounds": float(rounds), "sampling/dropped_groups": float(dropped),
               "sampling/short_groups": float(max(0, target - len(kept)))}
    return (kept[:target] if kept else last), metrics
