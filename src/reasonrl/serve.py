"""`reasonrl serve MODEL`: a rollout engine behind an OpenAI-compatible HTTP API.

Endpoints: POST /v1/chat/completions (messages through the model's chat template), POST
/v1/completions (a raw prompt string), GET /v1/models. Fields honoured: n, temperature, top_p,
top_k, max_tokens (or max_completion_tokens), stop, seed; responses carry the choices with their
finish_reason ("stop" or "length") and the token usage. Scoring (a distillation teacher,
reasonrl.training.teachers): /v1/completions with max_tokens=0 and echo=true returns, for each
prompt (a string, token ids, or a list of either), `logprobs.tokens` and `logprobs.token_logprobs`,
the log-prob of every prompt token at temperature 1 (None for the first), as OpenAI's legacy API and
vLLM do. Anything else in a request is ignored, as
OpenAI-compatible servers do; a malformed request gets a 400 with an OpenAI-style error body.

Written with the standard library's ThreadingHTTPServer: a small local server for evaluation,
judges and tests, not a production inference server (use vLLM or llama.cpp's server for that; the
`openai` engine talks to either). Requests are answered one at a time, since the engine holds one
model; it listens on loopback unless told otherwise.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

import torch

from reasonrl.training.token_stats import token_logprobs
from reasonrl.types import Problem, RolloutEngine, SamplingParams, TrainBatch


class RequestError(ValueError):
    """A request the server cannot answer: its message goes back to the client with status 400."""


def sampling_from_request(body: dict[str, Any], *, default_max_tokens: int) -> SamplingParams:
    """The SamplingParams an OpenAI-style request body asks for."""
    def number(name: str, default: float, kind: type = float) -> Any:
        value = body.get(name, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RequestError(f"'{name}' must be a number, got {value!r}")
        return kind(value)

    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    if not all(isinstance(s, str) for s in stop):
        raise RequestError(f"'stop' must be a string or a list of strings, got {body.get('stop')!r}")
    max_tokens = number("max_completion_tokens", number("max_tokens", default_max_tokens, int), int)
    sampling = SamplingParams(n=number("n", 1, int), temperature=number("temperature", 1.0),
                              top_p=number("top_p", 1.0), top_k=number("top_k", 0, int), max_new_tokens=max_tokens,
                              stop=stop, seed=number("seed", 0, int))
    if sampling.n < 1 or sampling.max_new_tokens < 1 or sampling.temperature < 0 or not 0 < sampling.top_p <= 1:
        raise RequestError(f"need n >= 1, max_tokens >= 1, temperature >= 0 and 0 < top_p <= 1; got n={sampling.n}, "
                           f"max_tokens={sampling.max_new_tokens}, temperature={sampling.temperature}, "
                           f"top_p={sampling.top_p}")
    return sampling


def problem_from_request(body: dict[str, Any], chat: bool) -> Problem:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise RequestError("'messages' must be a non-empty list of {'role': str, 'content': str}")
        return Problem(id="request", prompt=[{"role": m["role"], "content": m["content"]} for m in messages], answer="")
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise RequestError("'prompt' must be a non-empty string (one prompt per request)")
    return Problem(id="request", prompt=prompt, answer="")


@dataclass
class Server:
    """An engine served over HTTP; `url` is the base URL clients use (".../v1")."""

    engine: RolloutEngine
    model_name: str
    host: str = "127.0.0.1"
    port: int = 0
    default_max_tokens: int = 512

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._http = ThreadingHTTPServer((self.host, self.port), _handler(self))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> Self:
        """Serve in a background thread (for tests and notebooks)."""
        self._thread = threading.Thread(target=self._http.serve_forever, name="reasonrl-serve", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._http.serve_forever()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def complete(self, body: dict[str, Any], chat: bool) -> dict[str, Any]:
        if not chat and body.get("echo") and body.get("max_tokens") == 0:
            return self.score(body)
        problem = problem_from_request(body, chat)
        sampling = sampling_from_request(body, default_max_tokens=self.default_max_tokens)
        with self._lock:
            group = self.engine.generate([problem], sampling)[0]
        choices = []
        for index, completion in enumerate(group.completions):
            choice: dict[str, Any] = {"index": index, "finish_reason": completion.finish_reason}
            if chat:
                choice["message"] = {"role": "assistant", "content": completion.text}
            else:
                choice["text"] = completion.text
            choices.append(choice)
        completion_tokens = sum(len(c.token_ids) for c in group.completions)
        return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
                "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": {"prompt_tokens": len(group.prompt_ids), "completion_tokens": completion_tokens,
                          "total_tokens": len(group.prompt_ids) + completion_tokens}}


    def score(self, body: dict[str, Any]) -> dict[str, Any]:
        """The log-prob of every token of every prompt under the served model (max_tokens=0, echo=true)."""
        model, tokenizer = getattr(self.engine, "model", None), getattr(self.engine, "tokenizer", None)
        if model is None or tokenizer is None:
            raise RequestError("this server's engine cannot score prompts (echo with max_tokens=0)")
        prompts = [tokenizer.encode(p) if isinstance(p, str) else p for p in request_prompts(body.get("prompt"))]
        if any(not 0 <= i < len(tokenizer) for p in prompts for i in p):
            raise RequestError(f"token ids must lie in [0, {len(tokenizer)}): the model's vocabulary")
        with self._lock:
            scored = [sequence_logprobs(model, ids) for ids in prompts]
        choices = [{"index": index, "text": tokenizer.decode(ids), "finish_reason": "length",
                    "logprobs": {"tokens": [tokenizer.decode([i]) for i in ids], "token_logprobs": [None, *logprobs],
                                 "top_logprobs": None}}
                   for index, (ids, logprobs) in enumerate(zip(prompts, scored))]
        tokens = sum(len(ids) for ids in prompts)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens}}


def request_prompts(prompt: Any) -> list[str | list[int]]:
    """The prompts of a scoring request: a string, a list of token ids, or a list of either."""
    def is_ids(value: Any) -> bool:
        return isinstance(value, list) and bool(value) and all(isinstance(i, int) and not isinstance(i, bool)
                                                               for i in value)

    if (isinstance(prompt, str) and prompt) or is_ids(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and all((isinstance(p, str) and p) or is_ids(p) for p in prompt):
        return list(prompt)
    raise RequestError("'prompt' must be a non-empty string, a list of token ids, or a list of either")


def sequence_logprobs(model: Any, ids: list[int]) -> list[float]:
    """log p(ids[t + 1] | ids[:t + 1]) for t = 0 .. len(ids) - 2 at temperature 1, as the learner computes it."""
    if len(ids) < 2:
        return []
    device = next(model.parameters()).device
    input_ids = torch.tensor([ids], device=device)
    ones = torch.ones_like(input_ids)
    batch = TrainBatch(input_ids_NT=input_ids, attention_mask_NT=ones, loss_mask_NT=ones[:, 1:].float(),
                       sampling_logp_NT=ones[:, 1:].float(), advantages_NT=ones[:, 1:].float())
    with torch.no_grad():
        return token_logprobs(model, batch, 1.0)[0][0].tolist()


def _handler(server: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per request would drown the trainer's output

        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str, kind: str) -> None:
            self._reply(status, {"error": {"message": message, "type": kind}})

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                self._reply(200, {"object": "list", "data": [{"id": server.model_name, "object": "model"}]})
            else:
                self._error(404, f"no route GET {self.path}", "not_found")

        def do_POST(self) -> None:
            routes = {"/v1/chat/completions": True, "/v1/completions": False}
            path = self.path.rstrip("/")
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if path not in routes:
                self._error(404, f"no route POST {self.path}", "not_found")
                return
            try:
                body = json.loads(raw or b"{}")
                if not isinstance(body, dict):
                    raise RequestError("the request body must be a JSON object")
                self._reply(200, server.complete(body, chat=routes[path]))
            except (json.JSONDecodeError, RequestError) as exc:
                self._error(400, str(exc), "invalid_request_error")
            except Exception as exc:  # noqa: BLE001 - the client must get an answer; the server goes on
                self._error(500, f"{type(exc).__name__}: {exc}", "server_error")

    return Handler
