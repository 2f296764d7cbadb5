"""Groups sampled as trees (rollout.tree): completions that share their first segments.

`TreeSampler` wraps an engine that continues token-id prefixes (`continue_from`). With branching
factors (b_1, ..., b_D) and a segment length L, the prompt is continued b_1 times for L tokens;
each of those segments that did not end (end of sequence or a stop string) is continued b_2
times for L tokens; and so on, the last level's b_D continuations running to the completion
budget left (max_new_tokens - (D - 1) L). A segment that ends early is a completion of its own,
so a group holds at most b_1 x ... x b_D completions. Every segment is generated once, whatever
the number of completions through it: a tree of G completions costs fewer generated tokens than
G independent samples, and its completions are not independent (they share their beginnings).
Each completion's sampling log-probs are its segments' in order, each segment sampled after the
path before it, i.e. those of the same tokens sampled in one go. The group's `tree`
(types.TreeShape) records the segments, for tree advantages (reasonrl.algo.tree) and for the
packed learner, which computes each shared prefix once.

Branching happens at fixed depths (every L tokens), as in TreePO's fixed-length segments; TreeRL's
branching at high-entropy tokens is not implemented. A segment longer than the answers makes the
tree degenerate: every completion ends in the first segment, and a 2x2x2 tree is 2 samples. So
`segment_tokens=0` adapts L to the answers: the mean completion length of the previous call
divided by the tree's depth (so the last level too spans about one segment), at most what leaves
the last level a token; the first call, knowing nothing, takes max_new_tokens / depth. The mean
is the sampler's state (`state_dict`), checkpointed with the run, and it makes a problem's tree
depend on the calls before it; with a fixed L it depends on the problem's seed alone.

Each level prefills its prefixes again (the engine keeps no cache between calls): on these
lengths a prefill costs little next to decoding. Random streams: a node's continuations draw from
derive_seed(problem seed, "tree", node), so within a call a problem's tree does not depend on the
other problems of the batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from reasonrl.rollout.base import completion_text
from reasonrl.seeds import derive_seed, problem_seed
from reasonrl.types import Completion, Group, Problem, SamplingParams, TreeShape


@dataclass
class _Tree:
    """A problem's tree while it grows: per node its parent, tokens, log-probs and how it ended."""

    parents: list[int] = field(default_factory=list)
    tokens: list[tuple[int, ...]] = field(default_factory=list)
    logprobs: list[tuple[float, ...]] = field(default_factory=list)
    finish: list[str] = field(default_factory=list)
    children: dict[int, list[int]] = field(default_factory=dict)

    def add(self, parent: int, completion: Completion, finish: str) -> int:
        node = len(self.parents)
        self.parents.append(parent)
        self.tokens.append(completion.token_ids)
        self.logprobs.append(completion.logprobs)
        self.finish.append(finish)
        self.children.setdefault(parent, []).append(node)
        return node

    def path(self, node: int) -> list[int]:
        nodes = []
        while node >= 0:
            nodes.append(node)
            node = self.parents[node]
        return nodes[::-1]

    def path_tokens(self, node: int) -> list[int]:
        return [token for n in self.path(node) for token in self.tokens[n]]

    def leaves(self) -> list[int]:
        """The nodes without children, depth first, children in the order they were sampled."""
        order, stack = [], list(reversed(self.children.get(-1, [])))
        while stack:
            node = stack.pop()
            if node in self.children:
                stack.extend(reversed(self.children[node]))
            else:
                order.append(node)
        return order


class TreeSampler:
    """A RolloutEngine whose groups are trees (the module docstring), over `engine`, which must
    continue prefixes (`continue_from`, `prompt_ids`, `tokenizer`); `segment_tokens=0` adapts the
    segment length to the completions' mean length."""

    def __init__(self, engine: Any, branching: Sequence[int], segment_tokens: int):
        missing = [name for name in ("continue_from", "prompt_ids", "tokenizer") if not hasattr(engine, name)]
        if missing:
            raise ValueError(f"rollout.tree needs an engine that continues token-id prefixes; "
                             f"{type(engine).__name__} has no {', '.join(missing)}")
        if not branching or min(branching) < 1 or segment_tokens < 0:
            raise ValueError(f"a tree needs branching factors >= 1 and segments >= 1 token (0: adaptive), got "
                             f"{list(branching)} and {segment_tokens}")
        self.engine, self.branching, self.segment_tokens = engine, tuple(branching), segment_tokens
        self.mean_length: float | None = None  # of the last call's completions

    def state_dict(self) -> dict[str, Any]:
        return {"mean_length": self.mean_length}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mean_length = state["mean_length"]

    def segment_for(self, max_new_tokens: int) -> int:
        """The segment length of the next call: the fixed one, or the adaptive rule's."""
        if self.segment_tokens:
            return self.segment_tokens
        depth = len(self.branching)
        if depth == 1:
            return max_new_tokens
        expected = max_new_tokens if self.mean_length is None else self.mean_length
        return max(1, min(round(expected / depth), (max_new_tokens - 1) // (depth - 1)))

    seeds_per_problem = True  # `generate` takes a seed for each problem

    @property
    def group_size(self) -> int:
        return math.prod(self.branching)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.engine.load_weights(named_tensors)

    def close(self) -> None:
        self.engine.close()

    def generate(self, problems: Sequence[Problem], sampling: SamplingParams,
                 seeds: Sequence[int] | None = None) -> list[Group]:
        """One tree per problem with at most `sampling.n` (the branching's product) completions;
        `seeds`: one per problem (default: derived from sampling.seed and the problem's index)."""
        if sampling.n != self.group_size:
            raise ValueError(f"the tree {'x'.join(map(str, self.branching))} samples {self.group_size} completions "
                             f"per problem, not {sampling.n}")
        last_level = len(self.branching) - 1
        segment = self.segment_for(sampling.max_new_tokens)
        if sampling.max_new_tokens <= last_level * segment:
            raise ValueError(f"max_new_tokens={sampling.max_new_tokens} leaves no room for the last level after "
                             f"{last_level} segments of {segment} tokens")
        seeds = list(seeds) if seeds is not None else [problem_seed(sampling.seed, i) for i in range(len(problems))]
        prompts = [self.engine.prompt_ids(problem) for problem in problems]
        trees = [_Tree() for _ in problems]
        growing = [(b, -1) for b in range(len(problems))]  # (problem, node to continue; -1: the prompt)
        for level, branches in enumerate(self.branching):
            if not growing:
                break
            budget = segment if level < last_level else sampling.max_new_tokens - level * segment
            continuations = self.engine.continue_from(
                [prompts[b] + trees[b].path_tokens(node) for b, node in growing],
                replace(sampling, n=branches, max_new_tokens=budget),
                [derive_seed(seeds[b], "tree", node) for b, node in growing])
            next_growing = []
            for (b, parent), completions in zip(growing, continuations):
                for completion in completions:
                    node = trees[b].add(parent, completion, completion.finish_reason)
                    if level < last_level and completion.finish_reason == "length":
                        if self._stopped(trees[b].path_tokens(node), sampling.stop):
                            trees[b].finish[node] = "stop"  # a stop string across the segment boundary
                        else:
                            next_growing.append((b, node))
            growing = next_growing
        groups = [self._group(problem, prompt, tree, sampling.stop, segment)
                  for problem, prompt, tree in zip(problems, prompts, trees)]
        lengths = [len(c.token_ids) for group in groups for c in group.completions]
        if lengths:
            self.mean_length = sum(lengths) / len(lengths)
        return groups

    def _stopped(self, tokens: list[int], stop: tuple[str, ...]) -> bool:
        if not stop:
            return False
        text = self.engine.tokenizer.decode(tokens, skip_special_tokens=True)
        return any(s in text for s in stop)

    def _group(self, problem: Problem, prompt: list[int], tree: _Tree, stop: tuple[str, ...], segment: int) -> Group:
        leaves = tree.leaves()
        completions, paths = [], []
        for leaf in leaves:
            path = tree.path(leaf)
            tokens = tuple(token for n in path for token in tree.tokens[n])
            completions.append(Completion(
                token_ids=tokens, text=completion_text(self.engine.tokenizer, tokens, stop),
                logprobs=tuple(lp for n in path for lp in tree.logprobs[n]), finish_reason=tree.finish[leaf]))
            paths.append(tuple(path))
        shape = TreeShape(parents=tuple(tree.parents), sizes=tuple(len(t) for t in tree.tokens), paths=tuple(paths),
                          segment_tokens=segment)
        return Group(problem=problem, prompt_ids=tuple(prompt), completions=tuple(completions), tree=shape)
