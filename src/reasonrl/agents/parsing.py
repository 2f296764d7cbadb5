"""Finding the tool call in a model's turn, in the formats chat models are trained on.

- `tags`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen2.5 / Hermes chat templates);
- `json`: a bare JSON object `{"name": ..., "arguments": {...}}` (the function-calling format of
  Llama 3.1 and OpenAI-style templates; `parameters` is accepted for `arguments`);
- `python`: a fenced ```python code block, run by the `python` tool (tool-integrated reasoning
  as in ToRA, Gou et al. 2024, and ToRL, Li et al. 2025).

A parser returns a `ToolCall`, a `Malformed` (the turn tries to call a tool and fails: the
environment answers with an error observation so that the model can fix it), or None (no call:
the turn is a final answer). The first call of a turn is taken: one tool result per turn.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

PYTHON_TOOL = "python"


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Malformed:
    """A turn that tries to call a tool but cannot be parsed; `reason` is shown to the model."""

    reason: str


Parsed = ToolCall | Malformed | None
Parser = Callable[[str], Parsed]

_TAG_OPEN, _TAG_CLOSE = "<tool_call>", "</tool_call>"
_FENCE = re.compile(r"```(?:python|py)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
_JSON_START = re.compile(r"\{\s*\"name\"\s*:")
# json gives up on nesting deeper than the interpreter's recursion limit with a RecursionError: a malformed call too.
_TOO_DEEP = "the tool call is not valid JSON: it nests arrays or objects too deeply"


def parse_tags(text: str) -> Parsed:
    start = text.find(_TAG_OPEN)
    if start < 0:
        return None
    end = text.find(_TAG_CLOSE, start)
    if end < 0:
        return Malformed(f"{_TAG_OPEN} is not closed by {_TAG_CLOSE}")
    return _call_from_json(text[start + len(_TAG_OPEN): end].strip())


def parse_json(text: str) -> Parsed:
    match = _JSON_START.search(text)
    if match is None:
        return None
    try:
        obj, _ = json.JSONDecoder().raw_decode(text, match.start())
    except json.JSONDecodeError as exc:
        return Malformed(f"the tool call is not valid JSON: {exc.msg} (at character {exc.pos - match.start()})")
    except (RecursionError, ValueError) as exc:
        return _unreadable(exc)
    return _call_from_object(obj)


def parse_python(text: str) -> Parsed:
    match = _FENCE.search(text)
    if match is None:
        return None
    if not match.group(0).endswith("```"):
        return Malformed("the ```python block is not closed with ```")
    code = match.group(1)
    if not code.strip():
        return Malformed("the ```python block is empty")
    return ToolCall(PYTHON_TOOL, {"code": code})


def parse_auto(text: str) -> Parsed:
    """Whichever format appears first in the turn."""
    fence, json_start = _FENCE.search(text), _JSON_START.search(text)
    candidates = ((text.find(_TAG_OPEN), parse_tags), (fence.start() if fence else -1, parse_python),
                  (json_start.start() if json_start else -1, parse_json))
    found = [(position, parser) for position, parser in candidates if position >= 0]
    if not found:
        return None
    return min(found, key=lambda item: item[0])[1](text)


def _call_from_json(body: str) -> Parsed:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return Malformed(f"the tool call is not valid JSON: {exc.msg} (at character {exc.pos})")
    except (RecursionError, ValueError) as exc:
        return _unreadable(exc)
    return _call_from_object(obj)


def _unreadable(exc: RecursionError | ValueError) -> Malformed:
    """What JSON that parses but cannot be read says: nested too deep, or an integer past Python's
    4300-digit limit (a ValueError that is not a JSONDecodeError)."""
    return Malformed(_TOO_DEEP if isinstance(exc, RecursionError) else f"the tool call cannot be read: {str(exc)[:200]}")


def _call_from_object(obj: object) -> Parsed:
    if not isinstance(obj, dict):
        return Malformed(f"a tool call is a JSON object {{\"name\": ..., \"arguments\": {{...}}}}, got {obj!r:.80}")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return Malformed("the tool call has no \"name\" string")
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):  # some templates serialise the arguments once more
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):  # not JSON, nested too deep, or an integer past 4300 digits
            return Malformed(f"the arguments of {name!r} are a string that is not a JSON object")
    if not isinstance(arguments, dict):
        return Malformed(f"the arguments of {name!r} must be a JSON object, got {arguments!r:.80}")
    return ToolCall(name, arguments)


PARSERS: dict[str, Parser] = {"auto": parse_auto, "tags": parse_tags, "json": parse_json, "python": parse_python}

# What ends a model turn that calls a tool in each format (besides the end-of-sequence token), so
# that the tool runs as soon as the call is complete. Bare JSON has no closing marker.
TURN_STOPS: dict[str, tuple[str, ...]] = {"auto": (_TAG_CLOSE, "\n```\n"), "tags": (_TAG_CLOSE,), "json": (),
                                          "python": ("\n```\n",)}
