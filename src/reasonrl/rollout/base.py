"""Prompt rendering shared by every engine, and `generate` for the engines that continue token-id
prefixes. The engine protocols (RolloutEngine, PrefixEngine) live with the other seams in
reasonrl.types."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from reasonrl.types import Completion, Group, Problem, RolloutEngine, SamplingParams

__all__ = ["EngineFront", "PrefixContinuation", "RolloutEngine", "completion_text", "prompt_token_ids"]


def prompt_token_ids(tokenizer: Any, problem: Problem, *, chat_template: bool) -> list[int]:
    """The prompt's token ids: through the chat template (with the assistant turn opened) when
    asked for and available, else the plain prompt text."""
    use_template = chat_template and getattr(tokenizer, "chat_template", None)
    if isinstance(problem.prompt, str):
        if not use_template:
            return tokenizer(problem.prompt, add_special_tokens=True)["input_ids"]
        messages = [{"role": "user", "content": problem.prompt}]
    else:
        if not use_template:
            raise ValueError(f"problem {problem.id!r} is a chat conversation but the tokenizer has no chat "
                             "template; give the prompt as text or use a model with a chat template")
        messages = list(problem.prompt)
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def completion_text(tokenizer: Any, token_ids: Sequence[int], stop: Sequence[str]) -> str:
    """The text of generated tokens, cut before the first stop string it contains."""
    text = tokenizer.decode(list(token_ids), skip_special_tokens=True)
    for s in stop:
        if s in text:
            text = text[: text.index(s)]
    return text


class EngineFront:
    """What an engine front (an engine that plays episodes with another, `self.engine`, e.g. the agent
    engines) passes through to that engine: its tokenizer and padding, the weights it samples with,
    and closing it."""

    engine: Any

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def pad_id(self) -> int:
        return self.engine.pad_id

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.engine.load_weights(named_tensors)

    def close(self) -> None:
        self.engine.close()


class PrefixContinuation:
    """`prompt_ids` and `generate` for an engine that continues token-id prefixes
    (`continue_from`): each problem's prompt ids, continued `sampling.n` times. The engine sets
    `tokenizer` and `chat_template`."""

    tokenizer: Any
    chat_template: bool
    seeds_per_problem = True  # `generate` takes a seed for each problem

    def close(self) -> None:
        """Nothing to release: the model lives in this process."""

    def prompt_ids(self, problem: Problem) -> list[int]:
        return prompt_token_ids(self.tokenizer, problem, chat_template=self.chat_template)

    def generate(self, problems: Sequence[Problem], sampling: SamplingParams,
                 seeds: Sequence[int] | None = None) -> list[Group]:
        """`seeds`: one per problem (default: derived from sampling.seed and the problem's index)."""
        prompts = [self.prompt_ids(p) for p in problems]
        continuations = self.continue_from(prompts, sampling, seeds)
        return [Group(problem=problem, prompt_ids=tuple(prompt), completions=tuple(completions))
                for problem, prompt, completions in zip(problems, prompts, continuations)]

    def continue_from(self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams,
                      seeds: Sequence[int] | None = None) -> list[list[Completion]]:
        raise NotImplementedError
