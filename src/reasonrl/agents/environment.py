"""Multi-turn environments: what the model sees first, and what answers each of its turns.

An `Environment` is used for one episode: `reset(problem)` gives the first observation (the
prompt: text or chat messages); `step(action_text)` takes the model's turn and returns a
`StepResult` (the observation to insert before the next turn, the turn's reward, whether the
episode is over, and `info`). The rollout engine (reasonrl.agents.engine) reads two `info` keys
for its statistics: "tool_call" ("none", "valid" or "invalid") and, on the last step, "correct"
(the verifier's score of the final answer).

`ToolEnvironment` is the usual one: each turn either calls a tool (parsed by
reasonrl.agents.parsing), whose result is the next observation, or is the final answer, scored
by a verifier `fn(text, problem) -> float`. Rewards follow ToRL / ReTool practice (Li et al.
2025; Feng et al. 2025): the outcome decides, and small optional terms shape tool use.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from reasonrl.agents.parsing import PARSERS, Malformed, Parser, ToolCall
from reasonrl.agents.tools import Tool, ToolError, tool_schemas
from reasonrl.types import Message, Problem, RewardFn

VALID, INVALID, NO_CALL = "valid", "invalid", "none"
UNUSED = "unused"  # a call in the last allowed turn: not run, since no turn is left to read its result


@dataclass(frozen=True)
class StepResult:
    observation: str
    reward: float
    done: bool
    info: Mapping[str, Any] = field(default_factory=dict)


class Environment(Protocol):
    def reset(self, problem: Problem) -> str | Sequence[Message]:
        """Start an episode on `problem`; the first observation (the prompt the model sees)."""
        ...

    def step(self, action: str) -> StepResult:
        """The model's turn (its decoded text) in; the environment's answer out."""
        ...


INSTRUCTIONS = {
    "tags": "To call a tool, write <tool_call>{{\"name\": TOOL, \"arguments\": {{...}}}}</tool_call>; its result "
            "comes back in <tool_response> tags. Tools:\n{tools}\nWhen you know the answer, reply without a tool call.",
    "json": "To call a tool, reply with a JSON object {{\"name\": TOOL, \"arguments\": {{...}}}}. Tools:\n{tools}\n"
            "When you know the answer, reply without a tool call.",
    "python": "You can run Python: write the code in a ```python block; its output comes back in an ```output "
              "block. When you know the answer, reply without code.",
}
INSTRUCTIONS["auto"] = INSTRUCTIONS["tags"]


class ToolEnvironment:
    """Tool calls until a turn without one (the final answer) or `max_turns` model turns.

    Rewards: each valid call earns `tool_call_reward` (negative: a price on tool use), each
    invalid one (malformed, unknown tool, rejected arguments) `invalid_call_reward`; the last turn
    earns the verifier's score of its text, plus `tool_bonus` when that score is positive and the
    episode made a valid call (a correctness-gated bonus: tool use is rewarded only when it led to a
    right answer, so it cannot be farmed). `instructions`: text put before the problem, with
    `{tools}` filled by the tools' JSON schemas ("" for none; None: the default for the format).
    """

    def __init__(self, tools: Sequence[Tool], verifier: RewardFn, *, tool_format: str = "auto",
                 parser: Parser | None = None, max_turns: int = 4, tool_call_reward: float = 0.0,
                 invalid_call_reward: float = 0.0, tool_bonus: float = 0.0, instructions: str | None = None):
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        if parser is None and tool_format not in PARSERS:
            raise ValueError(f"unknown tool format {tool_format!r}; allowed: {', '.join(PARSERS)}")
        self.tools = {tool.name: tool for tool in tools}
        self.verifier, self.parser, self.max_turns = verifier, parser or PARSERS[tool_format], max_turns
        self.tool_call_reward, self.invalid_call_reward = tool_call_reward, invalid_call_reward
        self.tool_bonus = tool_bonus
        self.instructions = INSTRUCTIONS[tool_format] if instructions is None else instructions
        self.problem: Problem | None = None

    def reset(self, problem: Problem) -> str | Sequence[Message]:
        self.problem, self.turns, self.valid_calls, self.sessions = problem, 0, 0, {}
        preamble = self._preamble()
        if not preamble:
            return problem.prompt
        if isinstance(problem.prompt, str):
            return f"{preamble}\n\n{problem.prompt}"
        return [{"role": "system", "content": preamble}, *problem.prompt]

    def _preamble(self) -> str:
        if "{tools}" not in self.instructions:
            return self.instructions.replace("{{", "{").replace("}}", "}")
        listed = "\n".join(json.dumps(schema["function"]) for schema in tool_schemas(list(self.tools.values())))
        return string.Formatter().vformat(self.instructions, (), {"tools": listed})

    def step(self, action: str) -> StepResult:
        if self.problem is None:
            raise RuntimeError("ToolEnvironment.step before reset(problem)")
        self.turns += 1
        parsed = self.parser(action)
        if parsed is None:
            return self._final(action, 0.0, {"tool_call": NO_CALL})
        if self.turns >= self.max_turns:
            # No turn left to use a result: the text is the answer, and the call earns no call reward
            # (which the policy could otherwise collect by calling in place of answering).
            return self._final(action, 0.0, {"tool_call": UNUSED})
        if isinstance(parsed, Malformed):
            observation, info = f"Error: malformed tool call: {parsed.reason}", {"tool_call": INVALID}
        else:
            observation, info = self._call(parsed)
        reward = self.tool_call_reward if info["tool_call"] == VALID else self.invalid_call_reward
        return StepResult(observation, reward, False, info)

    def _call(self, call: ToolCall) -> tuple[str, dict[str, Any]]:
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(self.tools) or "none"
            return f"Error: there is no tool {call.name!r}; tools: {known}", {"tool_call": INVALID, "tool": call.name}
        try:
            result = tool(call.arguments, self.sessions.setdefault(call.name, {}))
        except ToolError as exc:
            return f"Error: {call.name}: {exc}", {"tool_call": INVALID, "tool": call.name}
        self.valid_calls += 1
        return result.output, {"tool_call": VALID, "tool": call.name, "tool_status": result.status}

    def _final(self, action: str, reward: float, info: dict[str, Any]) -> StepResult:
        correct = float(self.verifier(action, self.problem))
        bonus = self.tool_bonus if correct > 0 and self.valid_calls else 0.0
        return StepResult("", reward + correct + bonus, True, {**info, "correct": correct})
