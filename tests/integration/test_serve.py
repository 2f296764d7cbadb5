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
def engine(talking_model_dir):
    return HFEngine(load_model(str(talking_model_dir), dtype=torch.float32, device=torch.device("cpu")),
                    load_tokenizer(str(talking_model_dir)))


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
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert direct.text and reply["choices"][0]["message"]["content"] == direct.text
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
    ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": "two"}, 400, "'n' must be an integer"),
    ("/completions", {"prompt": "x", "top_p": 0}, 400, "'top_p' must be above 0"),
    ("/embeddings", {"input": "x"}, 404, "no route"),
])
def test_bad_requests_get_openai_style_errors(server, path, body, status, message):
    code, reply = post(server.url + path, body)
    assert code == status and message in reply["error"]["message"]


def test_openai_engine_against_the_real_server_matches_the_local_engine(server, engine):
    from reasonrl.rollout.openai import OpenAIEngine

    remote = OpenAIEngine(server.url, "tiny")
    problems = [Problem(id=str(i), prompt=f"question {i}", answer="") for i in range(3)]
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)
    over_http = remote.generate(problems, greedy)
    local = engine.generate(problems, greedy)
    assert all(g.completions[0].text for g in local)
    assert [g.completions[0].text for g in over_http] == [g.completions[0].text for g in local]
    assert [g.completions[0].finish_reason for g in over_http] == [g.completions[0].finish_reason for g in local]
    sampled = remote.generate(problems[:1], SamplingParams(n=4, temperature=1.0, max_new_tokens=4, seed=3))
    assert sampled[0].size == 4
    assert len({c.text for c in sampled[0].completions}) > 1  # four samples, not one reply four times


def test_a_judge_served_over_http_scores_completions(server):
    from reasonrl.rewards.judge import JudgeReward
    from reasonrl.rollout.openai import OpenAIEngine
    from reasonrl.types import Completion

    judge = JudgeReward(OpenAIEngine(server.url, "tiny"), votes=2, max_tokens=6)
    completions = [Completion(token_ids=(), text=t, logprobs=(), finish_reason="stop") for t in ("4", "5")]
    scores = judge.score_group(Problem(id="p", prompt="2 + 2?", answer="4"), completions)
    # A random tiny judge writes no parsable score: every vote is invalid and scores 0, nothing raises.
    assert scores == [0.0, 0.0]
    assert judge.stats.votes == 4 and judge.stats.invalid_votes == 4


def test_config_builds_a_served_judge_and_a_reward_model(server, tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    from reasonrl import load_config
    from reasonrl.build import build_weighted_reward
    from reasonrl.types import Completion

    classifier_dir = tmp_path / "rm"
    config = LlamaConfig(vocab_size=110, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, num_labels=1, pad_token_id=0)
    LlamaForSequenceClassification(config).save_pretrained(classifier_dir)
    AutoTokenizer.from_pretrained(str(tiny_model_dir)).save_pretrained(classifier_dir)
    cfg = load_config(overrides=[f"reward.judge_url={server.url}", "reward.judge_model=tiny", "reward.judge_weight=0.5",
                                 f"reward.reward_model={classifier_dir}", "reward.reward_model_weight=0.25"])
    reward = build_weighted_reward(cfg)
    assert {"correct", "judge", "reward_model"} <= set(reward.names)
    completions = [Completion(token_ids=(5,), text=t, logprobs=(0.0,), finish_reason="stop") for t in ("4", "5")]
    scores = reward.score_group(Problem(id="p", prompt="2 + 2?", answer="4"), completions)
    model_scores = scores.components["reward_model"]
    assert all(0.0 < s < 1.0 for s in model_scores)  # a sigmoid of the classifier's logit
    assert scores.components["judge"] == (0.0, 0.0)  # the random judge's votes are invalid
    # total = correct + 0.1 format (gated, no \boxed here: 0) + 0.5 judge + 0.25 reward model
    assert scores.totals[0] == pytest.approx(1.0 + 0.25 * model_scores[0])
