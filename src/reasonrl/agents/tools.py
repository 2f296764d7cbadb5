"""Tools a model can call during an episode: a Python interpreter (through reasonrl.sandbox), a
calculator, BM25 retrieval over local documents, and any Python function given a JSON schema.

A tool is an object with `name`, `description`, `parameters` (the JSON schema of its arguments, as
chat templates take it in `tools=[...]`) and `__call__(arguments, session) -> ToolResult`.
`session` is a dict the environment keeps for that tool for one episode (the interpreter keeps its
earlier cells there). A call the model got wrong (bad arguments, code that raises, a timeout) is a
`ToolResult` with `ok=False` whose output tells the model what happened; `ToolError` is the way for
a tool to say so. Only a tool that cannot work at all (the sandbox is missing) raises further.
"""

from __future__ import annotations

import ast
import inspect
import json
import math
import operator
import re
import typing
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from reasonrl import sandbox

Session = MutableMapping[str, Any]


class ToolError(Exception):
    """The call cannot be carried out as asked; the message is the observation the model sees."""


@dataclass(frozen=True)
class ToolResult:
    """What a call returned: `output` is shown to the model; `status` is "ok", "error" or "timeout"."""

    output: str
    status: str = "ok"

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Tool(Protocol):
    name: str
    description: str
    parameters: Mapping[str, Any]

    def __call__(self, arguments: Mapping[str, Any], session: Session) -> ToolResult: ...


def tool_schemas(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """The tools in the OpenAI / chat-template function format (`apply_chat_template(tools=...)`)."""
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": dict(t.parameters)}} for t in tools]


def validate_arguments(arguments: Mapping[str, Any], schema: Mapping[str, Any]) -> None:
    """Check `arguments` against an object schema's `properties`, `required`, property types
    (string, integer, number, boolean, array, object) and `enum`s; a mismatch is a ToolError naming
    it. Nested schemas are not checked (the tool sees what the model wrote)."""
    properties = schema.get("properties", {})
    missing = [name for name in schema.get("required", ()) if name not in arguments]
    if missing:
        raise ToolError(f"missing argument(s): {', '.join(missing)}")
    unknown = [name for name in arguments if name not in properties]
    if unknown and not schema.get("additionalProperties", False):
        raise ToolError(f"unknown argument(s): {', '.join(unknown)}; allowed: {', '.join(properties) or 'none'}")
    for name, value in arguments.items():
        expected = properties.get(name, {}).get("type")
        if expected is not None and not _has_json_type(value, expected):
            raise ToolError(f"argument {name!r} must be of type {expected}, got {type(value).__name__} {value!r:.60}")
        allowed = properties.get(name, {}).get("enum")
        if allowed is not None and value not in allowed:
            raise ToolError(f"argument {name!r} must be one of {', '.join(map(repr, allowed))}, got {value!r:.60}")


def _has_json_type(value: Any, expected: str | Sequence[str]) -> bool:
    if not isinstance(expected, str):
        return any(_has_json_type(value, e) for e in expected)
    checks: dict[str, Callable[[Any], bool]] = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
        "null": lambda v: v is None,
    }
    return checks.get(expected, lambda v: True)(value)


def _code_argument(arguments: Mapping[str, Any], key: str) -> str:
    validate_arguments(arguments, {"properties": {key: {"type": "string"}}, "required": [key]})
    return arguments[key]


# ---------------------------------------------------------------------------------------------
# Python interpreter

# Earlier cells are re-run with their output discarded, then the new cell; a last bare expression
# is printed as in a notebook. Everything runs in one namespace so that names carry over.
_PROGRAM = """\
import ast as _ast, contextlib as _contextlib, io as _io
_namespace = {{"__name__": "__main__"}}
for _cell in {cells!r}:
    with _contextlib.redirect_stdout(_io.StringIO()), _contextlib.redirect_stderr(_io.StringIO()):
        exec(compile(_cell, "<cell>", "exec"), _namespace)
_tree = _ast.parse({code!r}, "<cell>")
_last = _tree.body.pop() if _tree.body and isinstance(_tree.body[-1], _ast.Expr) else None
exec(compile(_tree, "<cell>", "exec"), _namespace)
if _last is not None:
    _value = eval(compile(_ast.Expression(_last.value), "<cell>", "eval"), _namespace)
    if _value is not None:
        print(repr(_value))
"""


@dataclass
class PythonTool:
    """Runs the model's code in the sandbox; state carries across the turns of one episode.

    The sandbox starts a fresh interpreter per run, so state is kept by re-running the episode's
    earlier *successful* cells (output discarded) before the new one: variables, functions and
    imports carry over, as in a notebook. The cost: earlier cells run again each time (the time
    limit covers them all), and what they did is redone, not remembered (random numbers are drawn
    again unless seeded). A cell that fails is not kept.
    """

    timeout_s: float = 5.0
    memory_mb: int = 512
    max_output_chars: int = 2000
    name: str = "python"
    description: str = ("Run Python code. State (variables, imports) is kept between calls; print() what you "
                        "need to see, or end with an expression to show its value.")

    @property
    def parameters(self) -> Mapping[str, Any]:
        return {"type": "object", "properties": {"code": {"type": "string", "description": "Python code to run"}},
                "required": ["code"]}

    def __call__(self, arguments: Mapping[str, Any], session: Session) -> ToolResult:
        code = _code_argument(arguments, "code")
        cells: list[str] = session.setdefault("cells", [])
        sandbox.log_layers()
        result = sandbox.run_python(_PROGRAM.format(cells=cells, code=code), timeout_s=self.timeout_s,
                                    memory_mb=self.memory_mb, max_output_bytes=4 * self.max_output_chars)
        stdout = _clip(result.stdout, self.max_output_chars)
        if result.status == "ok":
            cells.append(code)
            # The observation template ends its own lines.
            return ToolResult(stdout.rstrip("\n") if stdout.strip() else "(no output)")
        if result.status == "timeout":
            return ToolResult(f"{stdout}Error: the code did not finish within {self.timeout_s:g} s", "timeout")
        if result.status == "memory":
            return ToolResult(f"{stdout}Error: the code ran out of memory ({self.memory_mb} MB)", "error")
        if result.status == "killed":
            return ToolResult(f"{stdout}Error: the code was stopped: {result.detail or 'killed'}", "error")
        return ToolResult((stdout + _clip(_user_traceback(result.stderr), self.max_output_chars)).rstrip("\n"), "error")


def _user_traceback(stderr: str) -> str:
    """The traceback from the model's own cell on: the frames of the wrapper program mean nothing
    to the model. A syntax error has no frame; its caret block is kept."""
    lines = stderr.rstrip("\n").splitlines()
    first = next((i for i, line in enumerate(lines) if '"<cell>"' in line), None)
    if first is None:
        return (lines[-1] if lines else "Error") + "\n"
    return "Traceback (most recent call last):\n" + "\n".join(lines[first:]) + "\n"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters)\n"


# ---------------------------------------------------------------------------------------------
# Calculator

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt, "log": math.log, "log10": math.log10, "log2": math.log2, "exp": math.exp, "sin": math.sin,
    "cos": math.cos, "tan": math.tan, "abs": abs, "round": round, "floor": math.floor, "ceil": math.ceil,
    "factorial": math.factorial, "gcd": math.gcd, "min": min, "max": max}
_CONSTANTS = {"pi": math.pi, "e": math.e}
_MAX_EXPONENT = 1000
_MAX_FACTORIAL = 500
_MAX_DIGITS = 4000
_MAX_BITS = _MAX_DIGITS * 10 // 3
_MAX_EXPRESSION_CHARS = 2000  # deeper nesting than this would exhaust the parser's stack


def evaluate_expression(expression: str) -> int | float:
    """The value of an arithmetic expression, evaluated on its syntax tree: numbers, + - * / // % **,
    parentheses, pi, e and a few math functions. Nothing else is evaluated (no names, attributes or
    calls beyond those), and sizes are bounded so that `9**9**9` cannot hang the trainer."""
    if len(expression) > _MAX_EXPRESSION_CHARS:
        raise ToolError(f"the expression has {len(expression)} characters (at most {_MAX_EXPRESSION_CHARS})")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"cannot parse {expression[:200]!r}: {exc.msg}") from None
    except (ValueError, MemoryError, RecursionError) as exc:  # e.g. an integer literal of more than 4300 digits
        raise ToolError(f"cannot parse the expression: {type(exc).__name__}: {str(exc)[:200]}") from None
    try:
        return _evaluate(tree.body)
    except (ArithmeticError, ValueError, TypeError, RecursionError) as exc:
        raise ToolError(f"{type(exc).__name__}: {str(exc)[:200]}") from None


def _evaluate(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
        return _CONSTANTS[node.id]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT and abs(left) not in (0, 1):
            raise ToolError(f"exponent {right} is too large (at most {_MAX_EXPONENT})")
        if _result_bits(node.op, left, right) > _MAX_BITS:  # refused before the product is computed
            raise ToolError(f"the result has more than {_MAX_DIGITS} digits")
        value = _BINARY[type(node.op)](left, right)
        if isinstance(value, int) and value.bit_length() > _MAX_BITS:
            raise ToolError(f"the result has more than {_MAX_DIGITS} digits")
        return value
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
            and not node.keywords):
        args = [_evaluate(arg) for arg in node.args]
        if node.func.id == "factorial" and args and abs(args[0]) > _MAX_FACTORIAL:
            raise ToolError(f"factorial of {args[0]} is too large (at most {_MAX_FACTORIAL})")
        if node.func.id == "round" and len(args) > 1 and isinstance(args[1], int) and abs(args[1]) > _MAX_DIGITS:
            raise ToolError(f"round to {args[1]} digits: at most {_MAX_DIGITS}")  # it computes 10 ** digits
        return _FUNCTIONS[node.func.id](*args)
    raise ToolError(f"not allowed in an expression: {ast.unparse(node)!r} (numbers, + - * / // % **, "
                    f"parentheses, pi, e and {', '.join(_FUNCTIONS)})")


def _result_bits(op: ast.operator, left: Any, right: Any) -> int:
    """An upper bound on the bits of an integer product or power, 0 for everything else (sums and
    quotients of bounded operands stay bounded; floats overflow at once)."""
    if not (isinstance(left, int) and isinstance(right, int)):
        return 0
    if isinstance(op, ast.Mult):
        return left.bit_length() + right.bit_length()
    if isinstance(op, ast.Pow) and right > 0 and abs(left) > 1:
        return left.bit_length() * right
    return 0


@dataclass
class CalculatorTool:
    name: str = "calculator"
    description: str = "Evaluate an arithmetic expression, e.g. 3 * (17 + 4) ** 2 or sqrt(2)."

    @property
    def parameters(self) -> Mapping[str, Any]:
        return {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}

    def __call__(self, arguments: Mapping[str, Any], session: Session) -> ToolResult:
        return ToolResult(repr(evaluate_expression(_code_argument(arguments, "expression"))))


# ---------------------------------------------------------------------------------------------
# Retrieval

@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str


def load_corpus(path: str | Path) -> list[Document]:
    """Documents from a JSON-lines file with `text` and optional `id` and `title` per line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus {str(path)!r} does not exist: give agent.corpus a JSON-lines file with a "
                                "'text' (and optional 'id', 'title') per line")
    documents = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        record = json.loads(line)
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise ValueError(f"{path}:{number}: expected a JSON object with a 'text' string")  # noqa: TRY004 (bad data)
        documents.append(Document(str(record.get("id", number)), str(record.get("title", "")), record["text"]))
    if not documents:
        raise ValueError(f"corpus {path} holds no documents")
    return documents


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


class RetrievalTool:
    """BM25 search (Robertson and Zaragoza 2009, via the rank-bm25 package) over local documents:
    the `top_k` best documents for the query, each as `[title] text`. A query counts its first
    `MAX_QUERY_WORDS` words: rank-bm25 scores every document for every query word, so a query of the
    length of a whole answer costs the corpus's size times its words."""

    MAX_QUERY_WORDS = 64

    name = "search"
    description = "Search the document collection; returns the most relevant passages."

    def __init__(self, documents: Sequence[Document], *, top_k: int = 3, max_chars_per_document: int = 600):
        from rank_bm25 import BM25Okapi

        if not documents:
            raise ValueError("RetrievalTool needs at least one document")
        self.documents, self.top_k, self.max_chars = list(documents), top_k, max_chars_per_document
        self.index = BM25Okapi([_words(f"{d.title} {d.text}") for d in self.documents])

    @property
    def parameters(self) -> Mapping[str, Any]:
        return {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}

    def search(self, query: str) -> list[Document]:
        words = _words(query)[: self.MAX_QUERY_WORDS]
        if not words:
            raise ToolError("the query has no words")
        scores = self.index.get_scores(words)
        order = sorted(range(len(self.documents)), key=lambda i: (-scores[i], i))
        return [self.documents[i] for i in order[: self.top_k] if scores[i] > 0]

    def __call__(self, arguments: Mapping[str, Any], session: Session) -> ToolResult:
        found = self.search(_code_argument(arguments, "query"))
        if not found:
            return ToolResult("No document matches the query.")
        return ToolResult("\n".join(f"[{d.title}] {_clip(d.text, self.max_chars).strip()}" for d in found))


# ---------------------------------------------------------------------------------------------
# User functions

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def schema_from_signature(fn: Callable[..., Any]) -> dict[str, Any]:
    """An object schema from the function's annotated parameters (required: those without default)."""
    hints = typing.get_type_hints(fn)
    properties, required = {}, []
    for name, parameter in inspect.signature(fn).parameters.items():
        annotation = typing.get_origin(hints.get(name)) or hints.get(name)
        if annotation not in _JSON_TYPES:
            raise TypeError(f"cannot derive a JSON schema for parameter {name!r} of {fn.__name__} (annotation "
                            f"{hints.get(name)!r}): annotate it with str, int, float, bool, list or dict, or pass "
                            "parameters= explicitly")
        properties[name] = {"type": _JSON_TYPES[annotation]}
        if parameter.default is inspect.Parameter.empty:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required}


class FunctionTool:
    """A Python function as a tool: called with the model's arguments as keywords, its return value
    (a string, or JSON for anything else) is the observation. The schema is given, or derived from
    the annotations. Arguments are checked against it first; an exception the function raises is
    reported to the model as an error (it chose the arguments)."""

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None,
                 parameters: Mapping[str, Any] | None = None):
        self.fn = fn
        self.name = name or fn.__name__
        self.description = description if description is not None else inspect.getdoc(fn) or ""
        self.parameters = dict(parameters) if parameters is not None else schema_from_signature(fn)
        if self.parameters.get("type", "object") != "object":
            raise ValueError(f"tool {self.name!r}: the parameters schema must describe an object")

    def __call__(self, arguments: Mapping[str, Any], session: Session) -> ToolResult:
        validate_arguments(arguments, self.parameters)
        try:
            value = self.fn(**arguments)
        except Exception as exc:  # noqa: BLE001 - the model chose the arguments: it must see what they did
            return ToolResult(f"Error: {type(exc).__name__}: {exc}", "error")
        return ToolResult(value if isinstance(value, str) else json.dumps(value, default=str))
