"""A rollout engine for any server speaking the OpenAI chat-completions API (vLLM, SGLang,
llama.cpp's server, TGI, OpenAI itself, ...), written on the standard library alone.

It samples text; it is meant for evaluation and for model-based rewards (a judge model behind a
server, `rewards.judge.JudgeReward`), not for training a policy: the server's weights cannot be
synced from the learner, and the API gives neither the sampled token ids nor log-probabilities
under the tempered distribution, so completions carry empty `token_ids` and `logprobs`.
`rollout.engine=openai` builds it (reasonrl.rollout.choice) for evaluation; training refuses it.

One HTTP request per problem asks for all `n` samples of its group (the `n` parameter); requests
of different problems run concurrently. 429, 5xx and connection failures are retried with
exponential backoff (the server's Retry-After when it sends one); any other HTTP error is raised
at once with its status and body.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from reasonrl.types import Completion, FinishReason, Group, Problem, SamplingParams

_MAX_BODY_SHOWN = 2000
_MAX_RETRY_AFTER_S = 60.0

# Servers name the same two outcomes differently; anything else is unknown and raises.
FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "eos": "stop",
    "eos_token": "stop",
    "stop_sequence": "stop",
    "end_turn": "stop",
    "tool_calls": "stop",
    "function_call": "stop",
    "content_filter": "stop",
    "length": "length",
    "max_tokens": "length",
}


class OpenAIServerError(RuntimeError):
    """The server answered with an HTTP error (`status` and `body` as received), or could not be
    reached (`status` None) after all retries."""

    def __init__(self, message: str, status: int | None = None, body: str = ""):
        super().__init__(message)
        self.status = status
        self.body = body


def chat_messages(problem: Problem) -> list[dict[str, str]]:
    """The problem's prompt as chat messages: a text prompt is one user message."""
    if isinstance(problem.prompt, str):
        return [{"role": "user", "content": problem.prompt}]
    return [dict(message) for message in problem.prompt]


def request_body(model: str, problem: Problem, sampling: SamplingParams, n: int, seed: int,
                 extra_body: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body of a /chat/completions request for `n` samples of `problem`.

    `top_k` and `ignore_eos` are not part of the OpenAI API: each is sent only when set (top_k > 0,
    ignore_eos true), which vLLM and SGLang accept and OpenAI itself rejects."""
    body: dict[str, Any] = {
        "model": model,
        "messages": chat_messages(problem),
        "n": n,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_new_tokens,
        "seed": seed,
    }
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if sampling.top_k > 0:
        body["top_k"] = sampling.top_k
    if sampling.ignore_eos:
        body["ignore_eos"] = True
    body.update(extra_body)
    return body


def parse_choices(response: Mapping[str, Any], url: str) -> list[Completion]:
    """The completions of a chat-completions response, in choice-index order."""
    choices = response.get("choices")
    if not isinstance(choices, list):
        raise OpenAIServerError(f"{url} answered without a 'choices' list: {_shown(json.dumps(response))}")
    completions = []
    for choice in sorted(choices, key=lambda c: c.get("index", 0)):
        reason = choice.get("finish_reason")
        if reason not in FINISH_REASONS:
            raise OpenAIServerError(f"{url} gave finish_reason {reason!r}, which is neither a stop nor a length "
                                    f"limit; known: {', '.join(sorted(FINISH_REASONS))}")
        # A message without text (e.g. only tool calls) is an empty answer, not a malformed one.
        text = (choice.get("message") or {}).get("content") or ""
        completions.append(Completion(token_ids=(), text=text, logprobs=(), finish_reason=FINISH_REASONS[reason]))
    return completions


def _shown(body: str) -> str:
    if len(body) <= _MAX_BODY_SHOWN:
        return body
    return body[:_MAX_BODY_SHOWN] + f"... [{len(body) - _MAX_BODY_SHOWN} more chars]"


def _chat_url(base_url: str) -> str:
    """base_url as the OpenAI client takes it ("http://host:8000/v1"); a bare host gets /v1."""
    parsed = urllib.parse.urlsplit(base_url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"OpenAIEngine: base_url {base_url!r} is not an http(s) URL like 'http://localhost:8000/v1'")
    path = parsed.path.rstrip("/") or "/v1"
    return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path + "/chat/completions", "", ""))


class OpenAIEngine:
    """RolloutEngine for a model served behind an OpenAI-compatible /v1/chat/completions endpoint.

    `base_url` is the API root as the OpenAI client takes it ("http://localhost:8000/v1"; a URL
    without a path gets "/v1"). `api_key` is sent as a Bearer token; None reads the environment
    variable OPENAI_API_KEY, and when that is unset too no Authorization header is sent (local
    servers need none). `extra_body` is merged into every request (server-specific options such as
    {"chat_template_kwargs": {...}}). A failing request is retried `max_retries` times after
    `backoff_s`, 2 * `backoff_s`, ... seconds.

    Sampling maps one to one: n, temperature, top_p, max_new_tokens -> max_tokens, stop, seed
    (and top_k when > 0). A server that returns fewer than n choices (some ignore `n`) is asked
    again for the rest, with the seed moved on so that the extra samples differ.
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout_s: float = 60.0,
                 max_retries: int = 2, concurrency: int = 8, backoff_s: float = 0.5,
                 extra_body: Mapping[str, Any] | None = None):
        if max_retries < 0 or concurrency < 1 or timeout_s <= 0 or backoff_s < 0:
            raise ValueError(f"OpenAIEngine: need max_retries >= 0, concurrency >= 1, timeout_s > 0, backoff_s >= 0; "
                             f"got {max_retries}, {concurrency}, {timeout_s}, {backoff_s}")
        self.url = _chat_url(base_url)
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.concurrency = concurrency
        self.backoff_s = backoff_s
        self.extra_body = dict(extra_body or {})

    def close(self) -> None:
        """Nothing to release: the server runs on its own."""

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        raise NotImplementedError(f"OpenAIEngine serves model {self.model!r} from {self.url}: a remote server's "
                                  "weights cannot be synced from the learner. Train with rollout.engine=hf "
                                  "or vllm and use this one for evaluation or as a judge")

    def generate(self, problems: Sequence[Problem], sampling: SamplingParams) -> list[Group]:
        if sampling.n < 1:
            raise ValueError(f"OpenAIEngine: sampling.n must be >= 1, got {sampling.n}")
        if len(problems) <= 1:
            return [self._group(problem, sampling) for problem in problems]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(problems))) as pool:
            return list(pool.map(lambda problem: self._group(problem, sampling), problems))

    def _group(self, problem: Problem, sampling: SamplingParams) -> Group:
        completions: list[Completion] = []
        while len(completions) < sampling.n:
            body = request_body(self.model, problem, sampling, n=sampling.n - len(completions),
                                seed=sampling.seed + len(completions), extra_body=self.extra_body)
            got = parse_choices(self._post(body), self.url)
            if not got:
                raise OpenAIServerError(f"{self.url} returned no choices for problem {problem.id!r} (asked for "
                                        f"{body['n']})")
            completions.extend(got)
        return Group(problem=problem, prompt_ids=(), completions=tuple(completions[: sampling.n]))

    def _post(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return post_json(self.url, body, api_key=self.api_key, timeout_s=self.timeout_s, max_retries=self.max_retries,
                         backoff_s=self.backoff_s, what=f"model {self.model!r}")


def post_json(url: str, body: Mapping[str, Any], *, api_key: str | None = None, timeout_s: float = 60.0,
              max_retries: int = 2, backoff_s: float = 0.5, what: str = "the request") -> dict[str, Any]:
    """POST `body` as JSON to `url` and return the JSON answer. A refusal the server may lift (HTTP
    429, 5xx) or a failed connection is retried `max_retries` times after `backoff_s`, 2 * `backoff_s`,
    ... seconds (or the server's Retry-After, capped); then, or on any other HTTP error or an answer
    that is not JSON, an OpenAIServerError names the URL, `what` was asked, and the server's words."""
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    for attempt in range(max_retries + 1):
        request = urllib.request.Request(url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                text = response.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as exc:
            error_body = exc.read().decode("utf-8", errors="replace")
            retryable = exc.code == 429 or exc.code >= 500
            if not retryable or attempt == max_retries:
                tried = f" after {attempt + 1} attempts" if retryable else ""
                raise OpenAIServerError(f"{url} answered HTTP {exc.code}{tried} for {what}: {_shown(error_body)}",
                                        status=exc.code, body=error_body) from exc
            time.sleep(_retry_delay(backoff_s, attempt, exc.headers.get("Retry-After")))
            continue
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            if attempt == max_retries:
                raise OpenAIServerError(f"could not reach {url} after {attempt + 1} attempts: {exc}; is the server "
                                        "running and the URL right?") from exc
            time.sleep(_retry_delay(backoff_s, attempt, None))
            continue
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise OpenAIServerError(f"{url} answered with invalid JSON: {_shown(text)}", body=text) from exc
    raise AssertionError("unreachable: the last attempt returns or raises")


def _retry_delay(backoff_s: float, attempt: int, retry_after: str | None) -> float:
    if retry_after is not None:
        try:
            return min(max(float(retry_after), 0.0), _MAX_RETRY_AFTER_S)
        except ValueError:
            pass  # an HTTP-date: fall back to our own backoff
    return backoff_s * 2**attempt
