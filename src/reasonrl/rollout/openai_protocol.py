"""The OpenAI API as reasonrl's servers speak it: requests parsed into typed values (every field
checked: one the server does not support, or a value it cannot honour, is an `ApiError` naming it,
not silently ignored), and answers laid out as the official client reads them (chat completions,
legacy text completions, their streamed chunks, log-probs, tool calls, errors).

Used by `reasonrl serve` (reasonrl.serve) and by the endpoint that records what agents sample
(reasonrl.agents.endpoint), through reasonrl.rollout.openai_server. Null fields count as absent, as
the API defines. Besides the API's fields, `top_k`, `ignore_eos` and (chat) `chat_template_kwargs`
are taken, as vLLM takes them.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

MAX_TOP_LOGPROBS = 20
ROLES = ("system", "developer", "user", "assistant", "tool")


class ApiError(Exception):
    """A request the server does not answer: `status` (400 a bad or unsupported field, 404 an unknown
    model or route, 410 a closed episode), and the OpenAI error body's message, type, param and code."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def unsupported(name: str, value: Any, why: str = "") -> ApiError:
    return ApiError(400, f"'{name}'={value!r} is not supported{': ' + why if why else ''}", param=name,
                    code="unsupported_value")


@dataclass(frozen=True)
class RequestSampling:
    """The sampling a request asks for; None: not given (the server's default applies)."""

    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False


@dataclass(frozen=True)
class ChatRequest:
    """POST /chat/completions. `messages` are ready for a chat template (text content, tool calls'
    arguments as objects); `tools` the function schemas as sent."""

    model: str
    messages: tuple[Mapping[str, Any], ...]
    sampling: RequestSampling
    tools: tuple[Mapping[str, Any], ...] = ()
    parallel_tool_calls: bool = True
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    include_usage: bool = False
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CompletionRequest:
    """POST /completions: one or more raw prompts (text or token ids), never through a chat template.
    `logprobs`: None, or how many alternatives to list per token (0: the chosen token only)."""

    model: str
    prompts: tuple[str | tuple[int, ...], ...]
    sampling: RequestSampling
    logprobs: int | None = None
    echo: bool = False
    stream: bool = False
    include_usage: bool = False


class _Fields:
    """A request body read field by field; what no reader took is refused by `finish`."""

    def __init__(self, body: Any):
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        self.body = {key: value for key, value in body.items() if value is not None}
        self.taken: set[str] = set()

    def get(self, name: str, kinds: type | tuple[type, ...], what: str, default: Any = None) -> Any:
        self.taken.add(name)
        if name not in self.body:
            return default
        value = self.body[name]
        if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
            raise ApiError(400, f"'{name}' must be {what}, got {value!r}", param=name)
        if not isinstance(value, kinds):
            raise ApiError(400, f"'{name}' must be {what}, got {value!r}", param=name)
        return value

    def number(self, name: str, low: float, high: float, *, integer: bool = False) -> Any:
        kinds = int if integer else (int, float)
        value = self.get(name, kinds, "an integer" if integer else "a number")
        if value is not None and not (low <= value <= high and math.isfinite(value)):
            raise ApiError(400, f"'{name}' must lie in [{low:g}, {high:g}], got {value!r}", param=name)
        return value

    def neutral(self, name: str, is_neutral: Callable[[Any], bool], why: str) -> None:
        """A field the server does not implement, accepted only at a value that changes nothing."""
        self.taken.add(name)
        if name in self.body and not is_neutral(self.body[name]):
            raise unsupported(name, self.body[name], why)

    def finish(self, endpoint: str) -> None:
        if extra := sorted(set(self.body) - self.taken):
            raise ApiError(400, f"{endpoint}: unsupported field{'s' if len(extra) > 1 else ''} "
                                f"{', '.join(map(repr, extra))}", param=extra[0], code="unsupported_parameter")


def _common(fields: _Fields) -> tuple[str, RequestSampling, bool, bool]:
    """The fields both endpoints share: model, sampling, streaming, and the neutral ones."""
    model = fields.get("model", str, "a string", "")
    stop = fields.get("stop", (str, list), "a string or a list of strings", ())
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    if not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise ApiError(400, f"'stop' must be a non-empty string or a list of up to 4, got {stop!r}", param="stop")
    sampling = RequestSampling(
        n=fields.number("n", 1, 128, integer=True) or 1, temperature=fields.number("temperature", 0, 2),
        top_p=fields.number("top_p", 0, 1), top_k=fields.number("top_k", -1, 1 << 31, integer=True),
        max_tokens=fields.number("max_tokens", 0, 1 << 31, integer=True), stop=stop,
        seed=fields.number("seed", -(1 << 63), (1 << 63) - 1, integer=True),
        ignore_eos=fields.get("ignore_eos", bool, "a boolean", False))
    if sampling.top_p == 0:
        raise ApiError(400, "'top_p' must be above 0", param="top_p")
    stream = fields.get("stream", bool, "a boolean", False)
    options = fields.get("stream_options", dict, "an object", {})
    if options and not stream:
        raise ApiError(400, "'stream_options' is only allowed with stream=true", param="stream_options")
    if set(options) - {"include_usage"}:
        raise unsupported("stream_options", options, "only include_usage is")
    for name in ("frequency_penalty", "presence_penalty"):
        fields.neutral(name, lambda v: v == 0, "penalties are not implemented (0 only)")
    fields.neutral("logit_bias", lambda v: v == {}, "logit biases are not implemented")
    fields.neutral("user", lambda v: isinstance(v, str), "a string is expected")
    return model, sampling, stream, bool(options.get("include_usage", False))


def parse_chat_request(body: Any) -> ChatRequest:
    fields = _Fields(body)
    model, sampling, stream, include_usage = _common(fields)
    max_completion = fields.number("max_completion_tokens", 0, 1 << 31, integer=True)
    if max_completion is not None:
        sampling = replace(sampling, max_tokens=max_completion)
    if sampling.max_tokens == 0:
        raise ApiError(400, "'max_tokens' must be at least 1", param="max_tokens")
    messages = tuple(_message(m, i) for i, m in enumerate(fields.get("messages", list, "a list of messages", [])))
    if not messages:
        raise ApiError(400, "'messages' must be a non-empty list of messages", param="messages")
    tools = tuple(_tool(t, i) for i, t in enumerate(fields.get("tools", list, "a list of tools", [])))
    choice = fields.get("tool_choice", (str, dict), "'auto', 'none' or an object", "auto" if tools else "none")
    if choice not in ("auto", "none"):
        raise unsupported("tool_choice", choice, "the model decides whether to call a tool ('auto' or 'none')")
    logprobs = fields.get("logprobs", bool, "a boolean", False)
    top = fields.number("top_logprobs", 0, MAX_TOP_LOGPROBS, integer=True) or 0
    if top and not logprobs:
        raise ApiError(400, "'top_logprobs' needs logprobs=true", param="top_logprobs")
    fields.neutral("response_format", lambda v: v == {"type": "text"}, "structured output is not implemented")
    fields.neutral("store", lambda v: v is False, "requests are not stored")
    fields.neutral("modalities", lambda v: v == ["text"], "text only")
    fields.neutral("metadata", lambda v: isinstance(v, dict), "an object is expected")
    parallel = fields.get("parallel_tool_calls", bool, "a boolean", True)
    template_kwargs = fields.get("chat_template_kwargs", dict, "an object", {})
    fields.finish("/chat/completions")
    return ChatRequest(model=model, messages=messages, sampling=sampling,
                       tools=tools if choice == "auto" else (), parallel_tool_calls=parallel, logprobs=logprobs,
                       top_logprobs=top, stream=stream, include_usage=include_usage,
                       template_kwargs=template_kwargs)


def parse_completion_request(body: Any) -> CompletionRequest:
    fields = _Fields(body)
    model, sampling, stream, include_usage = _common(fields)
    prompts = _prompts(fields.get("prompt", (str, list), "a string, token ids, or a list of either"))
    logprobs = fields.number("logprobs", 0, MAX_TOP_LOGPROBS, integer=True)
    echo = fields.get("echo", bool, "a boolean", False)
    fields.neutral("best_of", lambda v: v == 1 or v == sampling.n, "best_of would need scoring the candidates")
    fields.neutral("suffix", lambda v: v == "", "insertion is not implemented")
    fields.finish("/completions")
    if sampling.max_tokens == 0 and not echo:
        raise ApiError(400, "max_tokens=0 generates nothing: with echo=true it scores the prompt", param="max_tokens")
    if sampling.max_tokens == 0 and (sampling.n != 1 or stream):
        raise ApiError(400, "scoring a prompt (max_tokens=0, echo=true) takes n=1 and no streaming", param="n")
    return CompletionRequest(model=model, prompts=prompts, sampling=sampling, logprobs=logprobs, echo=echo,
                             stream=stream, include_usage=include_usage)


def _prompts(prompt: Any) -> tuple[str | tuple[int, ...], ...]:
    """A string, a list of token ids, or a non-empty list of either."""
    def is_ids(value: Any) -> bool:
        return isinstance(value, list) and bool(value) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in value)

    if (isinstance(prompt, str) and prompt) or is_ids(prompt):
        items = [prompt]
    elif isinstance(prompt, list) and prompt and all((isinstance(p, str) and p) or is_ids(p) for p in prompt):
        items = list(prompt)
    else:
        raise ApiError(400, "'prompt' must be a non-empty string, a list of token ids, or a list of either",
                       param="prompt")
    return tuple(p if isinstance(p, str) else tuple(p) for p in items)


def _message(message: Any, index: int) -> dict[str, Any]:
    """A chat message as a template takes it: text content, tool calls with their arguments as objects."""
    where = f"messages[{index}]"
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise ApiError(400, f"{where} must be an object with a 'role' among {', '.join(ROLES)}", param=where)
    role = "system" if message["role"] == "developer" else message["role"]
    extra = set(message) - {"role", "content", "name", "tool_calls", "tool_call_id", "refusal"}
    if extra:
        raise ApiError(400, f"{where}: unsupported field(s) {', '.join(map(repr, sorted(extra)))}", param=where)
    out: dict[str, Any] = {"role": role, "content": _text_content(message.get("content"), where)}
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    if role == "tool":
        if not isinstance(message.get("tool_call_id"), str):
            raise ApiError(400, f"{where}: a tool message needs its 'tool_call_id'", param=where)
        out["tool_call_id"] = message["tool_call_id"]
    if message.get("tool_calls"):
        if role != "assistant" or not isinstance(message["tool_calls"], list):
            raise ApiError(400, f"{where}: 'tool_calls' is a list, on assistant messages only", param=where)
        out["tool_calls"] = [_tool_call(call, f"{where}.tool_calls[{i}]")
                             for i, call in enumerate(message["tool_calls"])]
    if out["content"] is None and "tool_calls" not in out:
        raise ApiError(400, f"{where}: 'content' is required", param=where)
    return out


def _text_content(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ApiError(400, f"{where}: 'content' must be text (a string or text parts); other parts are not supported",
                   param=where)


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ApiError(400, f"{where} must be {{'type': 'function', 'function': {{'name': ..., 'arguments': ...}}}}",
                       param=where)
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):  # templates render arguments as an object (transformers' convention)
        try:
            arguments = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            raise ApiError(400, f"{where}: 'arguments' is not JSON: {arguments!r:.80}", param=where) from None
    return {"id": call.get("id", ""), "type": "function", "function": {"name": function["name"], "arguments": arguments}}


def _tool(tool: Any, index: int) -> Mapping[str, Any]:
    if not (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(tool.get("function"), dict)
            and isinstance(tool["function"].get("name"), str)):
        raise ApiError(400, f"tools[{index}] must be {{'type': 'function', 'function': {{'name': ..., ...}}}}",
                       param=f"tools[{index}]")
    return tool


# --------------------------------------------------------------------------- answers


@dataclass(frozen=True)
class ToolCallOut:
    """A tool call parsed from a completion: `arguments` is the JSON text the API carries."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Choice:
    """One generated choice: its tokens (`text`: decoded, cut at a stop string), each token's sampling
    log-prob and, when asked, its `top` alternatives (token id, log-prob); with tools, the calls found
    in it and the text before them (`content`). `prompt_ids`/`prompt_logprobs` are echoed prompts."""

    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...]
    finish_reason: str
    top: tuple[tuple[tuple[int, float], ...], ...] | None = None
    tool_calls: tuple[ToolCallOut, ...] = ()
    content: str | None = None
    prompt_ids: tuple[int, ...] = ()
    prompt_logprobs: tuple[float | None, ...] = ()
    prompt_top: tuple[tuple[tuple[int, float], ...], ...] | None = None


@dataclass(frozen=True)
class Answer:
    """What a request produced: its choices in index order and the tokens of its prompts."""

    choices: tuple[Choice, ...]
    prompt_tokens: int

    def usage(self) -> dict[str, int]:
        completion = sum(len(c.token_ids) for c in self.choices)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion}


TokenText = Callable[[int], str]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def chat_response(answer: Answer, request: ChatRequest, model: str, token_text: TokenText) -> dict[str, Any]:
    choices = []
    for index, choice in enumerate(answer.choices):
        message: dict[str, Any] = {"role": "assistant", "content": choice.content if choice.tool_calls
                                   else choice.text, "refusal": None}
        if choice.tool_calls:
            message["tool_calls"] = [_tool_call_out(call) for call in choice.tool_calls]
        choices.append({"index": index, "message": message, "finish_reason": choice.finish_reason,
                        "logprobs": _chat_logprobs(choice, range(len(choice.token_ids)), token_text)
                        if request.logprobs else None})
    return {"id": new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": answer.usage(), "system_fingerprint": None}


def chat_chunks(answer: Answer, request: ChatRequest, model: str, token_text: TokenText,
                deltas: Callable[[Choice], list[str]]) -> Iterator[dict[str, Any]]:
    """The streamed chunks: per choice, its role, then one chunk per token (text it adds, its
    log-probs), or its content and its tool calls; then the finish reason; then the usage if asked."""
    head = {"id": new_id("chatcmpl"), "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "system_fingerprint": None, **({"usage": None} if request.include_usage else {})}

    def chunk(index: int, delta: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}

    for index, choice in enumerate(answer.choices):
        yield chunk(index, {"role": "assistant", "content": ""})
        if choice.tool_calls:
            logprobs = _chat_logprobs(choice, range(len(choice.token_ids)), token_text) if request.logprobs else None
            yield chunk(index, {"content": choice.content}, logprobs)
            yield chunk(index, {"tool_calls": [{"index": i, **_tool_call_out(call)}
                                               for i, call in enumerate(choice.tool_calls)]})
        else:
            for position, text in enumerate(deltas(choice)):
                logprobs = _chat_logprobs(choice, [position], token_text) if request.logprobs else None
                yield chunk(index, {"content": text}, logprobs)
        yield chunk(index, {}, None, choice.finish_reason)
    if request.include_usage:
        yield {**head, "choices": [], "usage": answer.usage()}


def _tool_call_out(call: ToolCallOut) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _chat_logprobs(choice: Choice, positions: Sequence[int] | range, token_text: TokenText) -> dict[str, Any]:
    def entry(token: int, logprob: float) -> dict[str, Any]:
        text = token_text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    content = [{**entry(choice.token_ids[p], choice.logprobs[p]),
                "top_logprobs": [entry(t, v) for t, v in choice.top[p]] if choice.top is not None else []}
               for p in positions]
    return {"content": content, "refusal": None}


def completion_response(answer: Answer, request: CompletionRequest, model: str,
                        token_text: TokenText) -> dict[str, Any]:
    choices = [{"index": index, "text": _echoed(choice, request, token_text) + choice.text,
                "finish_reason": choice.finish_reason,
                "logprobs": _legacy_logprobs(choice, request, token_text) if request.logprobs is not None else None}
               for index, choice in enumerate(answer.choices)]
    return {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": answer.usage(), "system_fingerprint": None}


def completion_chunks(answer: Answer, request: CompletionRequest, model: str, token_text: TokenText,
                      deltas: Callable[[Choice], list[str]]) -> Iterator[dict[str, Any]]:
    """The streamed chunks of text completions: the echoed prompt, one chunk per token, the finish."""
    head = {"id": new_id("cmpl"), "object": "text_completion", "created": int(time.time()), "model": model,
            "system_fingerprint": None, **({"usage": None} if request.include_usage else {})}

    def chunk(index: int, text: str, logprobs: Any = None, finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}]}

    for index, choice in enumerate(answer.choices):
        if request.echo:
            yield chunk(index, _echoed(choice, request, token_text))
        for position, text in enumerate(deltas(choice)):
            logprobs = None
            if request.logprobs is not None:
                logprobs = _legacy_logprobs(choice, request, token_text, only=position)
            yield chunk(index, text, logprobs)
        yield chunk(index, "", None, choice.finish_reason)
    if request.include_usage:
        yield {**head, "choices": [], "usage": answer.usage()}


def _echoed(choice: Choice, request: CompletionRequest, token_text: TokenText) -> str:
    return "".join(token_text(t) for t in choice.prompt_ids) if request.echo else ""


def _legacy_logprobs(choice: Choice, request: CompletionRequest, token_text: TokenText,
                     only: int | None = None) -> dict[str, Any]:
    """tokens, token_logprobs, top_logprobs ({token text: log-prob}) and text_offset, the prompt's first
    when echoed (its first token has no log-prob), as OpenAI's legacy API lays them out."""
    ids, values = list(choice.token_ids), list(choice.logprobs)
    tops = list(choice.top) if choice.top is not None else [()] * len(ids)
    if request.echo and only is None:
        ids = list(choice.prompt_ids) + ids
        values = list(choice.prompt_logprobs) + values
        tops = list(choice.prompt_top or [()] * len(choice.prompt_ids)) + tops
    positions = range(len(ids)) if only is None else [only]
    texts = [token_text(i) for i in ids]
    offsets, offset = [], 0
    for text in texts:
        offsets.append(offset)
        offset += len(text)
    return {"tokens": [texts[p] for p in positions], "token_logprobs": [values[p] for p in positions],
            "top_logprobs": [None if values[p] is None else {token_text(t): v for t, v in tops[p]} for p in positions],
            "text_offset": [offsets[p] for p in positions]}
