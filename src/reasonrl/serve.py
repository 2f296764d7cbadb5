"""`reasonrl serve MODEL`: a rollout engine behind the OpenAI API, as its official client expects.

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health. What a
request may ask and how it is answered is reasonrl.rollout.openai_server's (streaming, log-probs
and their alternatives, echo, raw prompts, tools through the chat template, n, stop, seed); here
are the server's defaults: temperature 1, top_p 1, `max_tokens` the server's `default_max_tokens`,
and, with no `seed`, a fresh random one per request (with one, a request samples the same
completions every time). A request naming another model than the served one gets a 404; a field
the server does not support, or a value it cannot honour, a 400 naming it.

Scoring (a distillation teacher, reasonrl.training.teachers): /v1/completions with max_tokens=0 and
echo=true returns, for each prompt (a string, token ids, or a list of either), `logprobs.tokens` and
`logprobs.token_logprobs`, the log-prob of every prompt token at temperature 1 (None for the first),
as OpenAI's legacy API and vLLM do.

Written with the standard library's ThreadingHTTPServer: a small local server for evaluation,
judges and tests, not a production inference server (use vLLM or llama.cpp's server for that; the
`openai` engine talks to either). Requests are answered one at a time, since the engine holds one
model; it listens on loopback unless told otherwise.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Self

from reasonrl.rollout.openai_protocol import ApiError, RequestSampling
from reasonrl.rollout.openai_server import ApiHttpServer, CompletionBackend, ModelScorer, random_seed
from reasonrl.types import Completion, SamplingParams

API_ROOT = "/v1"


@dataclass
class Server:
    """`engine` (a PrefixEngine: `continue_from`, `tokenizer`, `chat_template`; its `model`, when it
    has one, gives log-prob alternatives and prompt scores) served over HTTP as `model_name`; `url`
    is the base URL clients use (".../v1")."""

    engine: Any
    model_name: str
    host: str = "127.0.0.1"
    port: int = 0
    default_max_tokens: int = 512

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        model = getattr(self.engine, "model", None)
        self.backend = CompletionBackend(
            tokenizer=self.engine.tokenizer, chat_template=self.engine.chat_template, model_name=self.model_name,
            generate=self._generate, sampling=self._sampling,
            scorer=ModelScorer(model, self._lock) if model is not None else None)
        self._http = ApiHttpServer(self._route, host=self.host, port=self.port, name="reasonrl-serve")

    @property
    def url(self) -> str:
        return self._http.address + API_ROOT

    def start(self) -> Self:
        """Serve in a background thread (for tests and notebooks)."""
        self._http.start()
        return self

    def serve_forever(self) -> None:
        self._http.serve_forever()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _route(self, path: str) -> tuple[CompletionBackend, str]:
        if not path.startswith(API_ROOT + "/"):
            raise ApiError(404, f"no route {path}: the API lives under {API_ROOT}/", kind="not_found_error")
        return self.backend, path.removeprefix(API_ROOT)

    def _generate(self, prefixes: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        with self._lock:
            return self.engine.continue_from(prefixes, sampling)

    def _sampling(self, asked: RequestSampling) -> SamplingParams:
        return SamplingParams(n=asked.n, temperature=1.0 if asked.temperature is None else asked.temperature,
                              top_p=1.0 if asked.top_p is None else asked.top_p, top_k=max(asked.top_k or 0, 0),
                              max_new_tokens=asked.max_tokens or self.default_max_tokens, stop=asked.stop,
                              seed=random_seed() if asked.seed is None else asked.seed, ignore_eos=asked.ignore_eos)
