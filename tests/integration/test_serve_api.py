"""`reasonrl serve` as the official `openai` client uses it, sync and async, streamed and not: the
engine's own tokens and log-probs come back, raw prompts are not templated, seeds behave as the
API says, tools go through the chat template and calls come back, and what is not supported is
refused by name."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import openai
import pytest
import torch
from helpers import ScriptedPrefixEngine
from transformers import AutoTokenizer

from reasonrl.models import load_model, load_tokenizer
from reasonrl.rollout.base import prompt_token_ids
from reasonrl.rollout.hf import HFEngine
from reasonrl.seeds import problem_seed
from reasonrl.serve import Server
from reasonrl.types import Problem, SamplingParams

HELLO = [{"role": "user", "content": "hello"}]
# Renders the tools and the assistant's tool calls as <tool_call> JSON, as Hermes/Qwen-style templates do.
TOOLS_TEMPLATE = (
    "{% if tools %}<|system|>tools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}<eos>{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{% if m['tool_calls'] is defined %}{% for c in m['tool_calls'] %}"
    "<tool_call>{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}</tool_call>"
    "{% endfor %}{% else %}{{ m['content'] }}{% endif %}<eos>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")
ADD = {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return HFEngine(load_model(str(tiny_model_dir), dtype=torch.float32, device=torch.device("cpu")),
                    load_tokenizer(str(tiny_model_dir)))


@pytest.fixture(scope="module")
def server(engine):
    with Server(engine, "tiny") as running:
        yield running


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)


def test_chat_tokens_and_logprobs_are_the_engines_and_streaming_gives_the_same(client, engine):
    reply = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=8, seed=5, logprobs=True,
                                           top_logprobs=3)
    prompt = prompt_token_ids(engine.tokenizer, Problem(id="x", prompt=HELLO, answer=""), chat_template=True)
    direct = engine.continue_from([prompt], SamplingParams(max_new_tokens=8, seed=5))[0][0]
    choice = reply.choices[0]
    assert choice.message.content == direct.text and choice.finish_reason == direct.finish_reason
    assert reply.usage.prompt_tokens == len(prompt) and reply.usage.completion_tokens == len(direct.token_ids)
    assert [entry.logprob for entry in choice.logprobs.content] == list(direct.logprobs)
    for entry, token in zip(choice.logprobs.content, direct.token_ids):
        assert entry.token == engine.tokenizer.decode([token]) and len(entry.top_logprobs) == 3
        alternatives = [top.logprob for top in entry.top_logprobs]
        assert alternatives == sorted(alternatives, reverse=True) and alternatives[0] >= entry.logprob - 1e-5

    chunks = list(client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=8, seed=5, stream=True,
                                                 logprobs=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == direct.text
    assert [e.logprob for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content] \
        == list(direct.logprobs)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [direct.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(direct.token_ids)


def test_async_client_streams_and_samples_n_choices(server, engine):
    async def ask():
        client = openai.AsyncOpenAI(base_url=server.url, api_key="unused", max_retries=0)
        stream = await client.completions.create(model="tiny", prompt="ab", max_tokens=6, seed=2, stream=True)
        texts = [chunk.choices[0].text async for chunk in stream]
        several = await client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=4, n=3, seed=2)
        return texts, several

    texts, several = asyncio.run(ask())
    direct = engine.continue_from([engine.tokenizer("ab")["input_ids"]], SamplingParams(max_new_tokens=6, seed=2))
    assert "".join(texts) == direct[0][0].text
    assert [c.index for c in several.choices] == [0, 1, 2]
    assert len({c.message.content for c in several.choices}) > 1  # each choice draws from its own stream


def test_a_raw_prompt_is_not_templated_and_echo_returns_it_with_its_logprobs(client, engine):
    ids = engine.tokenizer("2+3=", add_special_tokens=True)["input_ids"]
    reply = client.completions.create(model="tiny", prompt="2+3=", max_tokens=5, seed=1, echo=True, logprobs=2)
    direct = engine.continue_from([ids], SamplingParams(max_new_tokens=5, seed=1))[0][0]
    assert reply.usage.prompt_tokens == len(ids) == 4  # "2", "+", "3", "=": no chat template around it
    choice = reply.choices[0]
    assert choice.text == "2+3=" + direct.text
    logprobs = choice.logprobs
    assert logprobs.tokens[:4] == ["2", "+", "3", "="] and logprobs.token_logprobs[0] is None
    assert logprobs.token_logprobs[4:] == list(direct.logprobs)
    assert all(len(top) == 2 for top in logprobs.top_logprobs[1:]) and logprobs.text_offset[:4] == [0, 1, 2, 3]


def test_scoring_a_prompt_with_the_client_gives_the_models_logprobs(client, engine):
    ids = engine.tokenizer("abcd")["input_ids"]
    reply = client.completions.create(model="tiny", prompt=ids, max_tokens=0, echo=True, logprobs=0)
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([ids])).logits[0].log_softmax(-1)
    expected = [logits[t - 1, ids[t]].item() for t in range(1, len(ids))]
    assert reply.choices[0].logprobs.token_logprobs[0] is None
    torch.testing.assert_close(torch.tensor(reply.choices[0].logprobs.token_logprobs[1:]), torch.tensor(expected),
                               atol=1e-5, rtol=0)
    assert reply.usage.completion_tokens == 0


def test_without_a_seed_sampling_is_random_and_with_one_it_repeats(client):
    def text(**seed):
        return client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=16, temperature=0.7,
                                              **seed).choices[0].message.content

    assert text() != text()
    assert text(seed=9) == text(seed=9)


def test_stop_strings_cut_the_text_and_end_the_choice(client, engine):
    greedy = engine.continue_from([engine.tokenizer("xy")["input_ids"]],
                                  SamplingParams(temperature=0.0, max_new_tokens=12))[0][0].text
    stop = greedy[4:6]
    reply = client.completions.create(model="tiny", prompt="xy", max_tokens=12, temperature=0, stop=[stop])
    assert reply.choices[0].text == greedy[: greedy.index(stop)]
    assert reply.choices[0].finish_reason == "stop"


def test_health_and_models(server):
    with urllib.request.urlopen(server.url.removesuffix("/v1") + "/health", timeout=10) as response:
        assert json.loads(response.read()) == {"status": "ok"}
    models = openai.OpenAI(base_url=server.url, api_key="unused").models.list()
    assert [m.id for m in models.data] == ["tiny"]


@pytest.mark.parametrize(("request_args", "error", "message"), [
    ({"model": "wrong-model"}, openai.NotFoundError, "'wrong-model' does not exist here"),
    ({"presence_penalty": 0.5}, openai.BadRequestError, "'presence_penalty'=0.5 is not supported"),
    ({"response_format": {"type": "json_object"}}, openai.BadRequestError, "'response_format'"),
    ({"tools": [ADD]}, openai.BadRequestError, "does not render tools"),
    ({"tools": [ADD], "tool_choice": "required"}, openai.BadRequestError, "'tool_choice'='required'"),
    ({"extra_body": {"guided_regex": "a+"}}, openai.BadRequestError, "unsupported field 'guided_regex'"),
    ({"top_logprobs": 2}, openai.BadRequestError, "'top_logprobs' needs logprobs=true"),
])
def test_what_is_not_supported_is_refused_by_name(client, request_args, error, message):
    args = {"model": "tiny", "messages": HELLO, "max_tokens": 2, **request_args}
    with pytest.raises(error, match=message):
        client.chat.completions.create(**args)


def test_tools_go_through_the_template_and_the_calls_come_back(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = TOOLS_TEMPLATE
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    engine = ScriptedPrefixEngine(tokenizer, lambda prompt: "5" if "<|tool|>" in prompt else "let me add " + call)
    with Server(engine, "scripted") as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "2 + 3?"}]
        reply = client.chat.completions.create(model="scripted", messages=messages, tools=[ADD], max_tokens=80)
        rendered = tokenizer.apply_chat_template(messages, tools=[ADD], add_generation_prompt=True, tokenize=False)
        assert rendered.startswith("<|system|>tools: add<eos>") and engine.calls[-1][0] == [
            tokenizer(rendered, add_special_tokens=False)["input_ids"]]
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content == "let me add"
        (tool_call,) = choice.message.tool_calls
        assert tool_call.function.name == "add" and json.loads(tool_call.function.arguments) == {"a": 2, "b": 3}

        # The call and its result go back through the template, the arguments as an object.
        history = [*messages, choice.message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": tool_call.id, "content": "5"}]
        answer = client.chat.completions.create(model="scripted", messages=history, tools=[ADD], max_tokens=80)
        assert answer.choices[0].message.content == "5" and answer.choices[0].finish_reason == "stop"
        assert call in tokenizer.decode(engine.calls[-1][0][0])

        chunks = list(client.chat.completions.create(model="scripted", messages=messages, tools=[ADD], max_tokens=80,
                                                     stream=True))
        streamed = [c.choices[0].delta.tool_calls for c in chunks if c.choices[0].delta.tool_calls]
        assert [[(t.function.name, json.loads(t.function.arguments)) for t in calls] for calls in streamed] == [
            [("add", {"a": 2, "b": 3})]]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_each_prompt_of_a_request_samples_from_its_own_seed(engine):
    # Two prompts in one request: prompt i draws from problem_seed(seed, i), as a request for it alone would.
    with Server(engine, "tiny") as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
        both = client.completions.create(model="tiny", prompt=["ab", "cd"], max_tokens=5, seed=4)
    ids = [engine.tokenizer(p)["input_ids"] for p in ("ab", "cd")]
    alone = engine.continue_from(ids, SamplingParams(max_new_tokens=5), seeds=[problem_seed(4, 0), problem_seed(4, 1)])
    assert [c.text for c in both.choices] == [alone[0][0].text, alone[1][0].text]
