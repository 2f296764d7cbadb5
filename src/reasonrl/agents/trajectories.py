"""From the calls an agent made to the sequences the learner trains on.

Each call records the token ids the engine was given and what it sampled (token ids and their
log-probs, exactly as generated: nothing is decoded and re-tokenised). An agent's next call usually
sends the conversation so far plus something new (a tool's result, a user turn): when a call's
prompt ids begin with the whole of an earlier trajectory (its prompt, what was sampled, what was
inserted since), the call continues that trajectory, the tokens in between being inserted ones
(loss mask 0, log-prob 0), as an `agents.AgentEngine` episode lays them out. A call that extends no
trajectory starts its own: a chat template that rewrites earlier turns (dropping a `<think>` block
from the history, say) or tokenises an earlier reply differently than it was sampled gives separate
samples, each exact, never one merged sequence whose tokens the model did not see.

`shared_prompt` then lays a problem's trajectories out as one Group: its prompt is the longest
prefix every trajectory's prompt begins with, and each completion holds the rest of its prompt
(masked) before its own tokens.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from reasonrl.types import Completion, FinishReason


@dataclass(frozen=True)
class Call:
    """One sampled choice of a request: the prompt ids the engine continued and the completion."""

    prompt_ids: tuple[int, ...]
    completion: Completion


@dataclass(frozen=True)
class Trajectory:
    """A sequence to train on: `prompt_ids`, then `token_ids` (sampled where `loss_mask` is 1, inserted
    where it is 0, with log-prob 0), ending as its last call did; `calls` merged into it."""

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    loss_mask: tuple[int, ...]
    finish_reason: FinishReason
    calls: int


@dataclass
class _Open:
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    finish_reason: FinishReason = "stop"
    calls: int = 0
    sequence: list[int] = field(default_factory=list)  # prompt_ids + token_ids, kept as they grow

    def __post_init__(self) -> None:
        self.sequence = [*self.prompt_ids, *self.token_ids]

    def is_begun_by(self, prompt: list[int]) -> bool:
        """Whether `prompt` begins with this whole sequence (its last token compared first: a prompt
        that extends nothing is told apart in O(1), not by comparing their shared beginning)."""
        n = len(self.sequence)
        return n <= len(prompt) and (n == 0 or prompt[n - 1] == self.sequence[-1]) and prompt[:n] == self.sequence

    def add(self, inserted: Sequence[int], completion: Completion) -> None:
        generated = list(completion.token_ids)
        self.token_ids += [*inserted, *generated]
        self.sequence += [*inserted, *generated]
        self.logprobs += [0.0] * len(inserted) + list(completion.logprobs)
        self.loss_mask += [0] * len(inserted) + [1] * len(generated)
        self.finish_reason, self.calls = completion.finish_reason, self.calls + 1


def assemble(calls: Sequence[Call]) -> list[Trajectory]:
    """The trajectories of an episode's calls, taken in the order they were made: each call continues
    the longest trajectory its prompt extends (the newest of equals), or starts one."""
    trajectories: list[_Open] = []
    for call in calls:
        prompt = list(call.prompt_ids)
        extended = [t for t in trajectories if t.is_begun_by(prompt)]
        if extended:
            target = max(reversed(extended), key=lambda t: len(t.sequence))
            target.add(prompt[len(target.sequence):], call.completion)
        else:
            trajectories.append(_Open(prompt_ids=prompt))
            trajectories[-1].add((), call.completion)
    return [Trajectory(prompt_ids=tuple(t.prompt_ids), token_ids=tuple(t.token_ids), logprobs=tuple(t.logprobs),
                       loss_mask=tuple(t.loss_mask), finish_reason=t.finish_reason, calls=t.calls)
            for t in trajectories]


def shared_prompt(trajectories: Sequence[Trajectory]) -> tuple[int, ...]:
    """The longest prefix of every trajectory's prompt (never a sampled token)."""
    prefix = os.path.commonprefix([list(t.prompt_ids) for t in trajectories])
    return tuple(prefix)


def after_prompt(trajectory: Trajectory, prompt: Sequence[int]) -> Trajectory:
    """`trajectory` with `prompt` as its prompt, the rest of its own prompt moved before its tokens as
    inserted ones (loss mask 0, log-prob 0)."""
    if list(trajectory.prompt_ids[:len(prompt)]) != list(prompt):
        raise ValueError("after_prompt: the trajectory's prompt does not begin with the shared prompt")
    moved = trajectory.prompt_ids[len(prompt):]
    return Trajectory(prompt_ids=tuple(prompt), token_ids=(*moved, *trajectory.token_ids),
                      logprobs=(0.0,) * len(moved) + trajectory.logprobs,
                      loss_mask=(0,) * len(moved) + trajectory.loss_mask, finish_reason=trajectory.finish_reason,
                      calls=trajectory.calls)
