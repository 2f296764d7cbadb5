"""The OpenAI API served in front of an engine that continues token ids (a PrefixEngine):
`CompletionBackend` answers parsed requests (reasonrl.rollout.openai_protocol), `ApiHttpServer`
carries them over HTTP on loopback, streamed as server-sent events when asked.

- Chat: the messages (and `tools`) go through the model's chat template, as transformers'
  `apply_chat_template(messages, tools=...)` renders them; with tools, the tool calls the model
  writes (`<tool_call>{...}</tool_call>`, or a bare `{"name": ..., "arguments": ...}` naming a
  given tool: reasonrl.agents.parsing) come back as the message's `tool_calls`. A template that
  does not render tools is refused rather than ignored.
- Completions: each prompt (text, or token ids) is taken as is, tokenised with the tokenizer's
  special tokens (a BOS where the model has one) and no template; `echo` returns it, with its
  log-probs when `logprobs` is set; `max_tokens=0` with `echo` scores a prompt without generating.
- Log-probs are those of the distribution sampled from (logits / temperature; temperature 0:
  the model's own): a sampled token's is the engine's own number; alternatives (`top_logprobs`,
  legacy `logprobs=k`) and echoed prompt tokens come from one forward pass of the engine's model.

Who decides the sampling (defaults, seeds), what generates (the engine, or a batching queue) and
what is recorded is passed in, so that `reasonrl serve` and the agent endpoint share the API.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol, Self

import torch

from reasonrl.agents.parsing import ToolCall, parse_json, parse_tags
from reasonrl.rollout.openai_protocol import (
    Answer,
    ApiError,
    ChatRequest,
    Choice,
    CompletionRequest,
    RequestSampling,
    ToolCallOut,
    chat_chunks,
    chat_response,
    completion_chunks,
    completion_response,
    new_id,
    parse_chat_request,
    parse_completion_request,
)
from reasonrl.types import Completion, SamplingParams

Generate = Callable[[list[list[int]], SamplingParams], list[list[Completion]]]
"""(prefixes, sampling) -> sampling.n completions of each prefix, as PrefixEngine.continue_from."""

Top = tuple[tuple[int, float], ...]
_JSON_CALL = re.compile(r'\{\s*"name"\s*:')  # where parse_json finds a bare call
MAX_PENDING_TOKENS = 4  # a stream holds back at most this many tokens' text (CompletionBackend._new_text)


class ModelScorer:
    """Per-position log-probs of a token sequence under a causal LM (the engine's model), at a
    temperature, with the `top` likeliest tokens of each position; `lock` keeps it off the model
    while the engine generates with it."""

    def __init__(self, model: Any, lock: AbstractContextManager[Any] | None = None):
        self.model, self.lock = model, lock or nullcontext()

    def __call__(self, ids: Sequence[int], start: int, temperature: float, top: int
                 ) -> tuple[list[float], list[Top]]:
        """For t in [max(start, 1), len(ids)): log p(ids[t] | ids[:t]) and the top alternatives."""
        start = max(start, 1)
        if start >= len(ids):
            return [], []
        device = next(self.model.parameters()).device
        with self.lock, torch.inference_mode():
            logits_TV = self.model(input_ids=torch.tensor([list(ids)], device=device)).logits[0, start - 1: -1]
        logp_TV = torch.log_softmax(logits_TV.float() / (temperature if temperature > 0 else 1.0), dim=-1)
        chosen = logp_TV.gather(1, torch.tensor(ids[start:], device=device)[:, None]).squeeze(1).tolist()
        if not top:
            return chosen, [() for _ in chosen]
        values, indices = logp_TV.topk(top, dim=-1)
        return chosen, [tuple(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]


Scorer = Callable[[Sequence[int], int, float, int], tuple[list[float], list[Top]]]


@dataclass
class CompletionBackend:
    """Answers /chat/completions and /completions for the model `model_name` by continuing token ids
    with `generate`. `sampling` turns a request's sampling into the engine's (defaults, limits,
    refusals, the seed); `scorer` (None: no alternatives or prompt log-probs) scores sequences;
    `on_sampled(prompt_ids, completions)` sees what was sampled for each prompt."""

    tokenizer: Any
    chat_template: bool
    model_name: str
    generate: Generate
    sampling: Callable[[RequestSampling], SamplingParams]
    scorer: Scorer | None = None
    on_sampled: Callable[[list[int], list[Completion]], None] | None = None

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "reasonrl"}]}

    def answer(self, path: str, body: Any) -> dict[str, Any] | list[dict[str, Any]]:
        """The JSON answer to POST `path`, or the chunks to stream (a list)."""
        if path == "/chat/completions":
            chat = parse_chat_request(body)
            self._check_model(chat.model)
            answer = self.chat(chat)
            if chat.stream:
                return list(chat_chunks(answer, chat, self.model_name, self.token_text, self.deltas))
            return chat_response(answer, chat, self.model_name, self.token_text)
        if path == "/completions":
            request = parse_completion_request(body)
            self._check_model(request.model)
            answer = self.complete(request)
            if request.stream:
                return list(completion_chunks(answer, request, self.model_name, self.token_text, self.deltas))
            return completion_response(answer, request, self.model_name, self.token_text)
        raise ApiError(404, f"no route POST {path}", kind="not_found_error")

    def _check_model(self, model: str) -> None:
        if model and model != self.model_name:
            raise ApiError(404, f"the model {model!r} does not exist here: this server serves {self.model_name!r}",
                           param="model", code="model_not_found")

    def token_text(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def chat(self, request: ChatRequest) -> Answer:
        prompt = self.render(request)
        sampling = self.sampling(request.sampling)
        completions = self._sample([prompt], sampling)[0]
        names = {tool["function"]["name"] for tool in request.tools}
        choices = []
        for completion in completions:
            top = self._top(prompt, completion, sampling.temperature, request.top_logprobs) if request.top_logprobs \
                else None
            content, calls = parse_tool_calls(completion.text, names) if names else (completion.text, ())
            if calls and not request.parallel_tool_calls:
                calls = calls[:1]
            choices.append(Choice(token_ids=completion.token_ids, text=completion.text, logprobs=completion.logprobs,
                                  finish_reason="tool_calls" if calls else completion.finish_reason, top=top,
                                  tool_calls=calls, content=content))
        return Answer(tuple(choices), len(prompt))

    def render(self, request: ChatRequest) -> list[int]:
        """The prompt's token ids: the messages (and tools) through the chat template, the assistant's turn open."""
        if not (self.chat_template and getattr(self.tokenizer, "chat_template", None)):
            raise ApiError(400, f"{self.model_name!r} has no chat template (or it is turned off): send a raw prompt "
                                "to /completions", param="messages")

        def text(tools: Any) -> str:
            try:
                return self.tokenizer.apply_chat_template(list(request.messages), tools=tools, tokenize=False,
                                                          add_generation_prompt=True, **request.template_kwargs)
            except Exception as exc:  # noqa: BLE001 - a template's own refusal (jinja raise_exception) goes back to the client
                raise ApiError(400, f"the chat template cannot render these messages: {type(exc).__name__}: {exc}",
                               param="messages") from None

        rendered = text([dict(tool) for tool in request.tools] or None)
        if request.tools and rendered == text(None):
            raise ApiError(400, f"the chat template of {self.model_name!r} does not render tools: it cannot be "
                                "offered them", param="tools")
        return list(self.tokenizer(rendered, add_special_tokens=False)["input_ids"])

    def complete(self, request: CompletionRequest) -> Answer:
        prompts = [self._prompt_ids(prompt) for prompt in request.prompts]
        if request.sampling.max_tokens == 0:  # score the prompts (echo): no generation
            temperature = request.sampling.temperature if request.sampling.temperature is not None else 1.0
            return Answer(tuple(self._scored_prompt(ids, temperature, request.logprobs) for ids in prompts),
                          sum(map(len, prompts)))
        sampling = self.sampling(request.sampling)
        choices = []
        for ids, completions in zip(prompts, self._sample(prompts, sampling)):
            echoed = self._scored_prompt(ids, sampling.temperature, request.logprobs) if request.echo else None
            for completion in completions:
                top = self._top(ids, completion, sampling.temperature, request.logprobs) if request.logprobs else None
                choice = Choice(token_ids=completion.token_ids, text=completion.text, logprobs=completion.logprobs,
                                finish_reason=completion.finish_reason, top=top)
                if echoed is not None:
                    choice = replace(choice, prompt_ids=echoed.prompt_ids, prompt_logprobs=echoed.prompt_logprobs,
                                     prompt_top=echoed.prompt_top)
                choices.append(choice)
        return Answer(tuple(choices), sum(map(len, prompts)))

    def _prompt_ids(self, prompt: str | tuple[int, ...]) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])
        if any(not 0 <= i < len(self.tokenizer) for i in prompt):
            raise ApiError(400, f"token ids must lie in [0, {len(self.tokenizer)}): the model's vocabulary",
                           param="prompt")
        return list(prompt)

    def _scored_prompt(self, ids: list[int], temperature: float, logprobs: int | None) -> Choice:
        """An echoed prompt: its ids and, with `logprobs`, each token's log-prob (None for the first)."""
        if logprobs is None:
            return Choice(token_ids=(), text="", logprobs=(), finish_reason="length", prompt_ids=tuple(ids))
        chosen, top = self._scorer("echo with logprobs")(ids, 1, temperature, logprobs)
        return Choice(token_ids=(), text="", logprobs=(), finish_reason="length", prompt_ids=tuple(ids),
                      prompt_logprobs=(None, *chosen), prompt_top=((), *top))

    def _top(self, prompt: list[int], completion: Completion, temperature: float, k: int) -> tuple[Top, ...]:
        _, top = self._scorer("top log-probs")([*prompt, *completion.token_ids], len(prompt), temperature, k)
        return tuple(top)

    def _scorer(self, what: str) -> Scorer:
        if self.scorer is None:
            raise ApiError(400, f"{what} need the engine's model, which this engine does not expose", param="logprobs")
        return self.scorer

    def _sample(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        outputs = self.generate(prompts, sampling)
        if self.on_sampled is not None:
            for ids, completions in zip(prompts, outputs):
                self.on_sampled(ids, completions)
        return outputs

    def deltas(self, choice: Choice) -> list[str]:
        """The text each token of the choice adds, for streaming: the new text of a window of recent
        tokens, as far as it continues the final text (a token ending inside a character adds nothing
        until the character is whole; tokens past a stop string add nothing); the last takes what
        remains. Decoding a window, not every prefix, keeps a long answer's stream linear (prefixes
        took 2.2 s at 3,200 tokens)."""
        final = (choice.content or "") if choice.tool_calls else choice.text
        ids = list(choice.token_ids)
        deltas, done, window_start, read = [], 0, 0, 0
        for k in range(1, len(ids) + 1):
            released = self._new_text(ids, window_start, read, k)
            new = ""
            if released is not None:
                new, upto = released
                window_start, read = read, upto
            agreed = done + len(os.path.commonprefix([new, final[done:done + len(new)]]))
            deltas.append(final[done:agreed])
            done = agreed
        if deltas:
            deltas[-1] += final[done:]
        return deltas

    def _new_text(self, ids: list[int], window_start: int, read: int, end: int) -> tuple[str, int] | None:
        """The text tokens [read, upto) add after those from `window_start`, and `upto`: all of them
        (upto = end) unless the text ends inside a character (as vLLM's incremental detokenizer: a window
        keeps context such as a leading space); then None, the tokens held.

        At most MAX_PENDING_TOKENS are held: past that, the tokens up to the last boundary that ends no
        character midway are released (a character spans at most 4 bytes, so with none such the first
        held token ends in bytes no later token completes, and it alone is released as it decodes; special
        tokens add no text). Held without a bound they would decode an ever longer window: quadratic in
        an answer of such tokens."""
        before = self.tokenizer.decode(ids[window_start:read], skip_special_tokens=True)
        after = self.tokenizer.decode(ids[window_start:end], skip_special_tokens=True)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            return after[len(before):], end
        if end - read < MAX_PENDING_TOKENS:
            return None
        for upto in range(end - 1, read, -1):
            text = self.tokenizer.decode(ids[window_start:upto], skip_special_tokens=True)
            if not text.endswith("\ufffd") or upto == read + 1:
                return text[len(before):], upto
        return None


def parse_tool_calls(text: str, names: set[str]) -> tuple[str | None, tuple[ToolCallOut, ...]]:
    """The text before the tool calls (None if empty) and the calls: every `<tool_call>` block, else a
    bare JSON call naming one of `names`. A malformed call leaves the whole text as content."""
    calls, rest, content_end = [], text, None
    while (start := rest.find("<tool_call>")) >= 0:
        parsed = parse_tags(rest[start:])
        if not isinstance(parsed, ToolCall):
            return text, ()
        if content_end is None:
            content_end = len(text) - len(rest) + start
        calls.append(parsed)
        rest = rest[rest.find("</tool_call>", start) + len("</tool_call>"):]
    if not calls:
        parsed = parse_json(text)
        if not isinstance(parsed, ToolCall) or parsed.name not in names:
            return text, ()
        calls, content_end = [parsed], _JSON_CALL.search(text).start()
    content = text[:content_end].strip() or None
    return content, tuple(ToolCallOut(id=new_id("call"), name=call.name, arguments=json.dumps(dict(call.arguments)))
                          for call in calls)


class Backend(Protocol):
    """What a route of ApiHttpServer answers (CompletionBackend, or a wrapper of one)."""

    def models(self) -> dict[str, Any]: ...

    def answer(self, path: str, body: Any) -> dict[str, Any] | list[dict[str, Any]]: ...


Route = Callable[[str], tuple[Backend, str]]
"""A request path -> (the backend that answers it, the API path: "/chat/completions", "/models", ...);
raises ApiError (404, 410) for a path nothing answers."""


class ApiHttpServer:
    """The API over HTTP/1.1 with the standard library's ThreadingHTTPServer: GET /health, GET
    .../models and POST .../chat/completions and .../completions as `route` maps them; a streamed
    answer goes as server-sent events (`data: {chunk}`, then `data: [DONE]`). `on_error(path,
    exception)` hears of every unexpected failure (a 500 for the client). Listens on loopback
    unless told otherwise."""

    def __init__(self, route: Route, *, host: str = "127.0.0.1", port: int = 0, name: str = "reasonrl-api",
                 on_error: Callable[[str, BaseException], None] | None = None):
        self.route, self.name, self.on_error = route, name, on_error
        self._http = _Listener((host, port), _handler(self))
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Self:
        """Serve in a background thread."""
        self._thread = threading.Thread(target=self._http.serve_forever, name=self.name, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._http.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self._http.shutdown()
        self._http.server_close()


class _Listener(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # every episode of a step may connect at once: the default 5 refuses them


def _handler(server: ApiHttpServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per request would drown the trainer's output

        def _json(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _events(self, chunks: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for data in [*(json.dumps(chunk) for chunk in chunks), "[DONE]"]:
                event = f"data: {data}\n\n".encode()
                self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")

        def _serve(self, answer: Callable[[], Any]) -> None:
            try:
                reply = answer()
            except ApiError as exc:
                self._json(exc.status, exc.body())
            except Exception as exc:  # noqa: BLE001 - the client gets an answer, whoever runs the server hears of it
                if server.on_error is not None:
                    server.on_error(self.path, exc)
                self._json(500, ApiError(500, f"{type(exc).__name__}: {exc}", kind="server_error").body())
            else:
                if isinstance(reply, list):
                    self._events(reply)
                else:
                    self._json(200, reply)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/health":
                self._json(200, {"status": "ok"})
                return

            def models() -> Any:
                backend, path = server.route(self.path.rstrip("/"))
                if path != "/models":
                    raise ApiError(404, f"no route GET {self.path}", kind="not_found_error")
                return backend.models()

            self._serve(models)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def answer() -> Any:
                backend, path = server.route(self.path.rstrip("/"))
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError as exc:
                    raise ApiError(400, f"the request body is not JSON: {exc}") from None
                return backend.answer(path, body)

            self._serve(answer)

    return Handler


def random_seed() -> int:
    """A seed for a request that gives none: each such request samples differently."""
    return int.from_bytes(os.urandom(8), "little") >> 1
