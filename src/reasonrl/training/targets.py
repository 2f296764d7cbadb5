"""Given solutions as training targets: a problem's prompt and a solution, laid out as a group of
one completion that the learner trains on as it trains on samples (supervised fine-tuning, DPO's
pairs, guidance's expert solutions)."""

from __future__ import annotations

from typing import Any

from reasonrl.rollout.base import prompt_token_ids
from reasonrl.types import Completion, Group, Problem


def sft_group(tokenizer: Any, problem: Problem, *, chat_template: bool, max_tokens: int) -> Group:
    """The problem's prompt and its solution (`problem.answer`, cut at `max_tokens`, then EOS) as a
    one-completion group whose completion is the training target."""
    solution_ids = tokenizer(problem.answer, add_special_tokens=False)["input_ids"][:max_tokens]
    if tokenizer.eos_token_id is not None:
        solution_ids = [*solution_ids, tokenizer.eos_token_id]
    if not solution_ids:
        raise ValueError(f"problem {problem.id!r} has an empty solution")
    completion = Completion(token_ids=tuple(solution_ids), text=problem.answer, logprobs=(0.0,) * len(solution_ids),
                            finish_reason="stop")
    return Group(problem=problem, prompt_ids=tuple(prompt_token_ids(tokenizer, problem, chat_template=chat_template)),
                 completions=(completion,))
