"""Built-in environments, by name (agent.environment): each entry takes keyword options and returns
a function that makes a fresh environment per episode.

- `python_math`: tool-integrated math (ToRA, Gou et al. 2024; ToRL, Li et al. 2025): the model may
  run Python (and a calculator); the final answer is checked by the math verifier.
- `retrieval_qa`: question answering over a local corpus with a BM25 search tool (the setting of
  Search-R1, Jin et al. 2025, with a local index); the final answer is scored by exact match.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from functools import partial

from reasonrl.agents.environment import INSTRUCTIONS, Environment, ToolEnvironment
from reasonrl.agents.tools import CalculatorTool, PythonTool, RetrievalTool, load_corpus
from reasonrl.rewards.answers import extract_answer
from reasonrl.spec import declare
from reasonrl.types import Problem, RewardFn

EnvironmentFactory = Callable[[], Environment]


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation (Rajpurkar et al. 2016): lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(completion: str, problem: Problem) -> float:
    """1 when the answer (\\boxed{}, <answer> tags or "the answer is ...") equals the gold answer or one
    of metadata["aliases"] after normalisation; no answer found scores 0."""
    answer = extract_answer(completion, "auto")
    if answer is None:
        return 0.0
    golds = [problem.answer, *problem.metadata.get("aliases", ())]
    return float(normalize_answer(answer) in {normalize_answer(str(gold)) for gold in golds})


# What every built-in environment reads of agent.* (AgentEngine reads the first two too).
_EPISODE_SETTINGS = {"tool_format": "agent.tool_format", "max_turns": "agent.max_turns",
                     "tool_call_reward": "agent.tool_call_reward", "invalid_call_reward": "agent.invalid_call_reward",
                     "tool_bonus": "agent.tool_bonus"}


@declare(inputs=("verifier",), knobs={"python_timeout_s": "agent.python_timeout_s"},
         context=_EPISODE_SETTINGS)
def python_math(*, verifier: RewardFn, tool_format: str = "python", max_turns: int = 4, tool_call_reward: float = 0.0,
                invalid_call_reward: float = 0.0, tool_bonus: float = 0.0, python_timeout_s: float = 5.0,
                instructions: str | None = None) -> EnvironmentFactory:
    tools = [PythonTool(timeout_s=python_timeout_s), CalculatorTool()]
    if instructions is None and tool_format == "auto":
        instructions = INSTRUCTIONS["python"]
    return partial(ToolEnvironment, tools, verifier, tool_format=tool_format, max_turns=max_turns,
                   tool_call_reward=tool_call_reward, invalid_call_reward=invalid_call_reward, tool_bonus=tool_bonus,
                   instructions=instructions)


@declare(knobs={"corpus": "agent.corpus", "top_k": "agent.retrieval_top_k"},
         context=_EPISODE_SETTINGS)
def retrieval_qa(*, corpus: str, verifier: RewardFn = exact_match, tool_format: str = "tags", max_turns: int = 4,
                 tool_call_reward: float = 0.0, invalid_call_reward: float = 0.0, tool_bonus: float = 0.0,
                 top_k: int = 3, instructions: str | None = None) -> EnvironmentFactory:
    if not corpus:
        raise ValueError("agent.environment=retrieval_qa searches agent.corpus: give it a JSON-lines file of "
                         "documents (e.g. examples/agents/corpus.jsonl)")
    search = RetrievalTool(load_corpus(corpus), top_k=top_k)  # indexed once, shared by every episode
    return partial(ToolEnvironment, [search], verifier, tool_format=tool_format, max_turns=max_turns,
                   tool_call_reward=tool_call_reward, invalid_call_reward=invalid_call_reward, tool_bonus=tool_bonus,
                   instructions=instructions)


ENVIRONMENTS: dict[str, Callable[..., EnvironmentFactory]] = {"python_math": python_math, "retrieval_qa": retrieval_qa}
