"""`reasonrl serve`: the OpenAI-compatible API in front of the HF engine, on loopback."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import torch

from reasonrl.models import load_model, load_tokenizer
from reasonrl.rollout.hf import HFEngine
from reasonrl.serve import Server
from reasonrl.types import Problem, SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return HFEngine(load_model(str(tiny_model_dir), dtype=torch.float32, device=torch.device("cpu")),
                    load_tokenizer(str(tiny_model_dir)))


@pytest.fixture
def server(engine):
    with Server(engine, "tiny") as running:
        yield running


def post(url: str, body: object) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_chat_completion_greedy_equals_the_engine(server, engine):
    status, reply = post(f"{server.url}/chat/completions", {"model": "tiny", "temperature": 0, "max_tokens": 6,
                                                            "messages": [{"role": "user", "content": "hello"}]})
    assert status == 200 and reply["object"] == "chat.completion" and reply["model"] == "tiny"
    direct = engine.generate([Problem(id="x", prompt=[{"role": "user", "content": "hello"}], answer="")],
                             SamplingParams(n=1, temperature=0.0, max_new_tokens=6))[0].completions[0]
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": direct.text}
    assert reply["choices"][0]["finish_reason"] == direct.finish_reason
    assert reply["usage"]["completion_tokens"] == len(direct.token_ids)


def test_n_samples_and_plain_completions(server):
    status, reply = post(f"{server.url}/completions", {"prompt": "abc", "n": 3, "max_tokens": 4, "seed": 1})
    assert status == 200 and len(reply["choices"]) == 3
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2]
    assert all(c["finish_reason"] in ("stop", "length") and isinstance(c["text"], str) for c in reply["choices"])
    with urllib.request.urlopen(f"{server.url}/models", timeout=10) as response:
        assert json.loads(response.read())["data"][0]["id"] == "tiny"


@pytest.mark.parametrize(("path", "body", "status", "message"), [
    ("/chat/completions", {"messages": []}, 400, "'messages' must be"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": "two"}, 400, "'n' must be a number"),
    ("/completions", {"prompt": "x", "top_p": 0}, 400, "0 < top_p <= 1"),
    ("/embeddings", {"input": "x"}, 404, "no route"),
])
def test_bad_requests_get_openai_style_errors(server, path, body, status, message):
    code, reply = post(server.url + path, body)
    assert code == status and message in reply["error"]["message"]
