"""Partial rollouts (`rollout.partial`): a step trains on the first groups to finish, and the
completions still being written are paused and continued under the next policy version (Kimi k1.5's
partial rollouts, AReaL's interruptible generation, verl's fully asynchronous trainer).

Why: reasoning chains are uneven, and a step that waits for its longest completion decodes its tail
with a nearly empty batch. Here a step's call adds its new groups to those still pending and decodes
all of their unfinished samples in one continuous batch (reasonrl.rollout.continuous), finished rows
replaced by waiting ones, until as many groups have finished as the step asked for; the rows still
going keep their tokens, and continue at the next step's call, whose new groups fill the batch
around them.

- A paused row's KV cache is not kept: it is prefilled again (prompt + its tokens so far) under the
  weights of the call that continues it, so each token is sampled by exactly one policy version, the
  one it is tagged with (`Completion.token_versions`; `policy_version` is the oldest). The learner's
  truncated importance correction (algo.tis, on at `auto`) weighs each token against the sampler's
  own log-prob, which is what a mix of versions needs.
- `max_versions` bounds the policy versions one completion may span: a row that has reached it is
  not paused again, and the call goes on until it finishes. 1 turns pausing off (every row finishes
  in the call that started it), leaving the continuous batch.
- Twice the step's groups are in flight (the first call starts them all; each later one starts as
  many as the step took), so a step can take the half that finishes first. The groups a call
  returns are the oldest finished ones; a group finished beyond the step's count waits for the next
  call. Each group's samples keep the random streams of the call that drew them,
  so a run is reproducible, and the pending groups are part of a checkpoint.
- What it does not cover: engines other than the in-process transformers engine with the fused
  decoder (vLLM, Ray workers), tree rollouts, agents and environments, adaptive sample budgets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from reasonrl.rollout.continuous import BatchStats, ContinuousBatch
from reasonrl.rollout.hf import HFEngine
from reasonrl.rollout.next_token import DecodeRow
from reasonrl.seeds import problem_seed
from reasonrl.types import Group, Problem, SamplingParams


@dataclass(eq=False)
class _Pending:
    """A group being generated: its problem (an index into the training problems) and its samples."""

    problem: int
    prompt_ids: tuple[int, ...]
    rows: list[DecodeRow]

    @property
    def done(self) -> bool:
        return all(row.finish is not None for row in self.rows)


class PartialRollouts:
    """Groups of `problems` (the training problems) generated on `engine` across calls, pausing the
    unfinished ones at each call's end; `generate(problems, sampling, version, wanted)` returns `wanted`
    finished groups."""

    def __init__(self, engine: Any, problems: Sequence[Problem], *, max_versions: int):
        if not isinstance(engine, HFEngine) or engine.fused is None:
            raise ValueError("rollout.partial needs rollout.engine=hf with the fused decoder (rollout.fused=true and a "
                             "Llama-family model: Llama, Mistral, Qwen2/3)")
        if max_versions < 1:
            raise ValueError(f"rollout.max_partial_versions={max_versions} must be >= 1")
        self.engine, self.problems, self.max_versions = engine, problems, max_versions
        self.index_of = {id(problem): index for index, problem in enumerate(problems)}
        self.pending: list[_Pending] = []
        self.stats = BatchStats()  # of the last call

    def shortfall(self, wanted: int) -> int:
        """How many groups beyond the step's `wanted` new ones to start, so that twice `wanted` are in
        flight: the step can then take the first half to finish and leave the slowest paused."""
        return max(0, wanted - len(self.pending))

    def generate(self, problems: Sequence[Problem], sampling: SamplingParams, version: int,
                 wanted: int | None = None) -> list[Group]:
        """`wanted` (default: one per problem) finished groups, oldest first, after adding a group of
        `sampling.n` samples for each of `problems` (seeded as the engine seeds them) and decoding with
        the weights of `version`."""
        wanted = len(problems) if wanted is None else wanted
        prompts = [self.engine.prompt_ids(problem) for problem in problems]
        seeds = [problem_seed(sampling.seed, index) for index in range(len(problems))]
        rows = self.engine.rows_for(prompts, sampling, seeds) if problems else []
        n = sampling.n
        self.pending += [_Pending(self.index_of[id(problem)], tuple(prompt), rows[b * n:(b + 1) * n])
                         for b, (problem, prompt) in enumerate(zip(problems, prompts))]
        if len(self.pending) < wanted:
            raise ValueError(f"{wanted} groups asked for, {len(self.pending)} in flight")
        unfinished = [row for group in self.pending for row in group.rows if row.finish is None]

        def enough() -> bool:
            if sum(group.done for group in self.pending) < wanted:
                return False
            return not any(row.finish is None and len(set(row.versions)) >= self.max_versions for row in unfinished)

        batch = ContinuousBatch(self.engine.fused, self.engine.ends(sampling), max_rows=self.engine.max_rows,
                                version=version, steps=self.engine.continuous_steps())
        with torch.inference_mode():
            batch.run(unfinished, enough)
        self.stats = batch.stats
        finished = [group for group in self.pending if group.done][:wanted]
        self.pending = [group for group in self.pending if group not in finished]
        return [self._group(group, sampling) for group in finished]

    def _group(self, pending: _Pending, sampling: SamplingParams) -> Group:
        completions = tuple(replace(self.engine.completion(row, sampling), token_versions=tuple(row.versions),
                                    policy_version=min(row.versions, default=None)) for row in pending.rows)
        return Group(problem=self.problems[pending.problem], prompt_ids=pending.prompt_ids, completions=completions)

    def paused(self) -> int:
        """Samples paused with some of their tokens generated."""
        return sum(1 for group in self.pending for row in group.rows if row.finish is None and row.tokens)

    def state_dict(self) -> dict[str, Any]:
        return {"pending": [(group.problem, group.prompt_ids, group.rows) for group in self.pending]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pending = [_Pending(problem, prompt_ids, rows) for problem, prompt_ids, rows in state["pending"]]
