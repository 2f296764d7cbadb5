"""Dynamic sampling (Yu et al. 2025, "DAPO", section 3.2): keep only groups that teach something.

DAPO keeps a group when 0 < #correct < G (eq. 11): a group that is all correct or all wrong
carries no signal about correctness. It over-samples and filters the rest out, generating more
problems until the batch is full of informative groups. `has_correctness_spread` is that rule.
`has_reward_spread` is a looser one (the group's total rewards differ): with secondary rewards
such as DAPO's overlong punishment it keeps all-wrong groups whose lengths differ, which then
teach length alone. Here generation goes in
rounds: each round draws as many new problems as are still missing, and after `max_rounds`
rounds the step trains on what it has (counted in `sampling/short_groups`), so a task the policy
has fully solved or cannot solve at all slows a step down by a bounded factor, never forever; a
step that kept no group at all makes no update (the trainer logs `sampling/skipped_update`).

The kept groups hold 1 to G-1 correct answers by construction, so the step's `reward/*` metrics,
computed on them, sit near the middle whatever the policy does (a policy at 4% accuracy can show a
training reward of 0.8). `sampling/reward_mean_all` and `sampling/accuracy_all` are `reward/mean` and
`reward/correct` taken over every completion of every round, kept or dropped: what the policy
does (the accuracy is the mean of the "correct" component, as in `reward/correct` and the
evaluation, so a checker with partial credit, such as reasoning-gym's, counts its scores, not the
share above 0); and
`sampling/dropped_frac`, the share of the sampled groups the rule dropped, is the share that had
nothing to teach (the kept groups' `rollout/zero_std_frac` is 0 by construction).
`sampling/dropped_graded_frac` is the share of the sampled groups dropped although the checker's
scores differed: under the correctness rule, a checker with partial credit (reasoning-gym's) gives
groups that would teach but hold no whole solution, and the `no_gradient` alarm names the reward
rule when they are most of what was dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from reasonrl.sampling.difficulty import group_accuracy
from reasonrl.types import Group, Problem

DROPPED_FRAC = "sampling/dropped_frac"  # the share of a step's sampled groups that `keep` dropped
REWARD_MEAN_ALL = "sampling/reward_mean_all"  # the mean reward of every completion sampled, kept or dropped
ACCURACY_ALL = "sampling/accuracy_all"  # reward/correct, over every completion sampled
DROPPED_GRADED_FRAC = "sampling/dropped_graded_frac"  # the share of sampled groups dropped with scores that differ


def has_reward_spread(group: Group) -> bool:
    """Whether the group's total rewards are not all equal."""
    return max(group.rewards) > min(group.rewards)


def has_score_spread(group: Group) -> bool:
    """Whether the checker's scores (`Group.outcomes`: partial credit counts) are not all equal."""
    return max(group.outcomes) > min(group.outcomes)


def has_correctness_spread(group: Group) -> bool:
    """Whether some but not all of the group's completions are correct (DAPO: 0 < #correct < G)."""
    return 0.0 < group_accuracy(group) < 1.0


# The rules sampling.dynamic_keep names.
DYNAMIC_KEEP: dict[str, Callable[[Group], bool]] = {
    "correctness": has_correctness_spread,
    "reward": has_reward_spread,
}


def fill_batch(draw: Callable[[int], Sequence[Problem]], rollout: Callable[[Sequence[Problem], int], list[Group]],
               target: int, *, max_rounds: int, keep: Callable[[Group], bool] = has_reward_spread,
               ) -> tuple[list[Group], dict[str, float]]:
    """Up to `target` scored groups that `keep` accepts, from at most `max_rounds` rounds of
    `rollout(draw(missing), round)`; and metrics of how many rounds and dropped groups it took.

    When no round yields a kept group, the last round's groups are returned for the step's
    metrics and logs; the caller must not learn from them (none passes `keep`): with
    `has_correctness_spread`, an all-wrong group can still differ in a secondary reward such as
    the overlong punishment, and training on it would teach that alone.
    """
    if target < 1 or max_rounds < 1:
        raise ValueError(f"fill_batch: target={target} and max_rounds={max_rounds} must be >= 1")
    kept: list[Group] = []
    dropped = dropped_graded = rounds = 0
    last: list[Group] = []
    sampled: list[Group] = []
    while len(kept) < target and rounds < max_rounds:
        last = rollout(draw(target - len(kept)), rounds)
        rounds += 1
        sampled += last
        for group in last:
            if keep(group):
                kept.append(group)
            else:
                dropped += 1
                dropped_graded += has_score_spread(group)
    completions = sum(group.size for group in sampled)
    metrics = {"sampling/rounds": float(rounds), "sampling/dropped_groups": float(dropped),
               "sampling/short_groups": float(max(0, target - len(kept))),
               DROPPED_FRAC: dropped / max(len(sampled), 1), DROPPED_GRADED_FRAC: dropped_graded / max(len(sampled), 1),
               REWARD_MEAN_ALL: sum(sum(group.rewards) for group in sampled) / max(completions, 1),
               ACCURACY_ALL: sum(sum(group.outcomes) for group in sampled) / max(completions, 1),
               # reward/timeouts counts the kept groups' checks; a dropped group's took their time too
               "sampling/reward_timeouts_all": float(sum(group.reward_timeouts for group in sampled))}
    return (kept[:target] if kept else last), metrics
