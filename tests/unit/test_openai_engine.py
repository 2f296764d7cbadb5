"""OpenAIEngine against a fake OpenAI-compatible server on 127.0.0.1 (http.server in a thread)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

import pytest

from reasonrl.rollout.openai import OpenAIEngine, OpenAIServerError, parse_choices
from reasonrl.types import Problem, SamplingParams

Reply = tuple[int, dict]
"""(HTTP status, JSON body) the fake server answers with."""


class FakeServer:
    """Records each request (path, headers, JSON body) and answers with `reply(body, call_index)`."""

    def __init__(self, reply: Callable[[dict, int], Reply]):
        self.reply = reply
        self.requests: list[tuple[str, dict, dict]] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    index = len(server.requests)
                    server.requests.append((self.path, dict(self.headers), body))
                status, payload = server.reply(body, index)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01},
                                       daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def chat_response(texts: list[str], reasons: list[str] | None = None) -> dict:
    reasons = reasons or ["stop"] * len(texts)
    return {"id": "x", "object": "chat.completion",
            "choices": [{"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
                        for i, (text, reason) in enumerate(zip(texts, reasons))]}


def echo(body: dict, index: int) -> Reply:
    """n choices "<last user message> #i", the last one cut by the length limit."""
    prompt = body["messages"][-1]["content"]
    n = body["n"]
    return 200, chat_response([f"{prompt} #{i}" for i in range(n)], ["stop"] * (n - 1) + ["length"])


@pytest.fixture
def echo_server() -> Iterator[FakeServer]:
    with FakeServer(echo) as server:
        yield server


def test_request_body_and_samples(echo_server: FakeServer) -> None:
    engine = OpenAIEngine(echo_server.url, "judge-model", api_key="sk-test")
    sampling = SamplingParams(n=3, temperature=0.7, top_p=0.9, max_new_tokens=32, stop=("</answer>",), seed=5)
    problems = [Problem(id="a", prompt="2+2?", answer="4"),
                Problem(id="b", prompt=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1?"}],
                        answer="2")]
    groups = engine.generate(problems, sampling)

    assert [g.problem.id for g in groups] == ["a", "b"]
    assert [c.text for c in groups[0].completions] == ["2+2? #0", "2+2? #1", "2+2? #2"]
    assert [c.text for c in groups[1].completions] == ["1+1? #0", "1+1? #1", "1+1? #2"]
    assert [c.finish_reason for c in groups[0].completions] == ["stop", "stop", "length"]
    assert all(c.token_ids == () and c.logprobs == () for g in groups for c in g.completions)

    assert len(echo_server.requests) == 2  # one request per problem carries all n samples
    by_prompt = {body["messages"][-1]["content"]: (path, headers, body) for path, headers, body in echo_server.requests}
    path, headers, body = by_prompt["2+2?"]
    assert path == "/v1/chat/completions"
    assert headers["Authorization"] == "Bearer sk-test"
    assert body == {"model": "judge-model", "messages": [{"role": "user", "content": "2+2?"}], "n": 3,
                    "temperature": 0.7, "top_p": 0.9, "max_tokens": 32, "seed": 5, "stop": ["</answer>"]}
    assert by_prompt["1+1?"][2]["messages"] == [{"role": "system", "content": "be brief"},
                                                 {"role": "user", "content": "1+1?"}]


def test_api_key_from_environment_and_bare_host(echo_server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    OpenAIEngine(echo_server.url.removesuffix("/v1"), "m").generate([Problem("a", "q", "")], SamplingParams())
    monkeypatch.delenv("OPENAI_API_KEY")
    OpenAIEngine(echo_server.url, "m", extra_body={"top_k": 20}).generate([Problem("a", "q", "")], SamplingParams())
    (path0, headers0, _), (_, headers1, body1) = echo_server.requests
    assert path0 == "/v1/chat/completions"  # a URL without a path gets /v1
    assert headers0["Authorization"] == "Bearer sk-env"
    assert "Authorization" not in headers1
    assert body1["top_k"] == 20 and "stop" not in body1


def test_server_ignoring_n_is_asked_for_the_rest() -> None:
    def one_choice(body: dict, index: int) -> Reply:
        return 200, chat_response([f"seed {body['seed']}"])

    with FakeServer(one_choice) as server:
        groups = OpenAIEngine(server.url, "m").generate([Problem("a", "q", "")], SamplingParams(n=3, seed=10))
    assert [c.text for c in groups[0].completions] == ["seed 10", "seed 11", "seed 12"]
    assert [body["n"] for _, _, body in server.requests] == [3, 2, 1]


def test_http_error_shows_status_and_body() -> None:
    def bad_request(body: dict, index: int) -> Reply:
        return 400, {"error": {"message": "model 'nope' does not exist"}}

    with FakeServer(bad_request) as server:
        engine = OpenAIEngine(server.url, "nope", backoff_s=0.0)
        with pytest.raises(OpenAIServerError, match=r"HTTP 400.*model 'nope' does not exist") as info:
            engine.generate([Problem("a", "q", "")], SamplingParams())
    assert info.value.status == 400
    assert len(server.requests) == 1  # a client error is not retried


def test_retry_after_one_server_error() -> None:
    def fail_first(body: dict, index: int) -> Reply:
        return (500, {"error": "busy"}) if index == 0 else (200, chat_response(["ok"]))

    with FakeServer(fail_first) as server:
        groups = OpenAIEngine(server.url, "m", backoff_s=0.01).generate([Problem("a", "q", "")], SamplingParams())
    assert groups[0].completions[0].text == "ok"
    assert len(server.requests) == 2


def test_retries_run_out() -> None:
    with FakeServer(lambda body, index: (503, {"error": "down"})) as server:
        engine = OpenAIEngine(server.url, "m", max_retries=2, backoff_s=0.0)
        with pytest.raises(OpenAIServerError, match=r"HTTP 503 after 3 attempts.*down"):
            engine.generate([Problem("a", "q", "")], SamplingParams())
    assert len(server.requests) == 3


def test_unreachable_server() -> None:
    with FakeServer(echo) as server:
        url = server.url
    engine = OpenAIEngine(url, "m", max_retries=1, backoff_s=0.0, timeout_s=5)
    with pytest.raises(OpenAIServerError, match="could not reach .* after 2 attempts"):
        engine.generate([Problem("a", "q", "")], SamplingParams())


def test_unknown_finish_reason_and_weight_sync_raise() -> None:
    with pytest.raises(OpenAIServerError, match="finish_reason 'abort'"):
        parse_choices(chat_response(["x"], ["abort"]), "http://s")
    with pytest.raises(NotImplementedError, match="cannot be synced"):
        OpenAIEngine("http://127.0.0.1:1/v1", "m").load_weights([])
    with pytest.raises(ValueError, match="not an http"):
        OpenAIEngine("localhost:8000", "m")


def test_ignore_eos_is_sent_only_when_asked() -> None:
    from reasonrl.rollout.openai import request_body

    problem = Problem("a", "q", "")
    assert "ignore_eos" not in request_body("m", problem, SamplingParams(), 1, 0, {})
    assert request_body("m", problem, SamplingParams(ignore_eos=True), 1, 0, {})["ignore_eos"] is True
