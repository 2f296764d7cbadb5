"""The endpoint that records what agents sample, and training an agent written with the `openai`
client (task.agent): what is trained is exactly what was sampled, the engine's log-probs included;
calls merge only where the tokens agree; refusals, timeouts and failing agents lose their episode
only; a tiny model learns through a two-call agent."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace

import openai
import pytest
import torch
from helpers import TASK, ScriptedPrefixEngine, step_metrics, tiny_config
from transformers import AutoTokenizer

from reasonrl import train
from reasonrl.agents.endpoint import AgentEndpoint
from reasonrl.agents.openai_agents import AgentEpisodeError, OpenAIAgentEngine
from reasonrl.models import load_model, load_tokenizer
from reasonrl.rollout.base import prompt_token_ids
from reasonrl.rollout.hf import HFEngine
from reasonrl.seeds import derive_seed
from reasonrl.training.learner import make_train_batch
from reasonrl.training.token_stats import token_logprobs
from reasonrl.types import Problem, SamplingParams

SAMPLING = SamplingParams(n=1, temperature=1.0, max_new_tokens=6, seed=0)
# Qwen3 / DeepSeek-R1 style: earlier assistant turns lose their <think> block in the history.
THINK_STRIPPING_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{% if m['role'] == 'assistant' %}"
    "{{ m['content'].split('</think>')[-1] }}{% else %}{{ m['content'] }}{% endif %}<eos>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")


class RecordingEngine(HFEngine):
    """The hf engine, keeping every prefix it continued and what it sampled, and how many calls it served."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sampled, self.batches = [], []

    def continue_from(self, prefixes, sampling, seeds=None):
        outputs = super().continue_from(prefixes, sampling, seeds)
        self.batches.append(len(prefixes))
        self.sampled += [(list(p), c) for p, cs in zip(prefixes, outputs) for c in cs]
        return outputs


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return RecordingEngine(load_model(str(tiny_model_dir), dtype=torch.float32, device=torch.device("cpu")),
                           load_tokenizer(str(tiny_model_dir)))


def chat(base_url, messages, **args):
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    return client.chat.completions.create(messages=messages, **{"model": "tiny", "max_tokens": 6, **args})


def two_calls(base_url, model, problem):
    """Plan, then answer: the second call's history holds the first reply; the reward is the answer's share of 'a'."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": f"plan: {problem.prompt}"}]
    plan = client.chat.completions.create(model=model, messages=messages, max_tokens=6).choices[0].message.content
    messages += [{"role": "assistant", "content": plan}, {"role": "user", "content": "answer"}]
    answer = client.chat.completions.create(model=model, messages=messages, max_tokens=6).choices[0].message.content
    return answer.count("a") / max(len(answer), 1)


async def two_calls_async(base_url, model, problem):
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": f"plan: {problem.prompt}"}]
    plan = (await client.chat.completions.create(model=model, messages=messages, max_tokens=6)).choices[0]
    messages += [{"role": "assistant", "content": plan.message.content}, {"role": "user", "content": "answer"}]
    stream = await client.chat.completions.create(model=model, messages=messages, max_tokens=6, stream=True)
    answer = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
    return answer.count("a") / max(len(answer), 1)


# ---------------------------------------------------------------------------- the endpoint


def test_each_call_records_the_prompt_it_was_given_and_the_engines_tokens_and_logprobs(engine):
    with AgentEndpoint(engine, "tiny") as endpoint:
        episode = endpoint.open_episode(SAMPLING, seed=11, timeout_s=60)
        first = chat(episode.base_url, [{"role": "user", "content": "hi"}], logprobs=True)
        chat(episode.base_url, [{"role": "user", "content": "hi"},
                                {"role": "assistant", "content": first.choices[0].message.content},
                                {"role": "user", "content": "more"}])
        record = episode.finish()
    assert len(record.calls) == 2 and not record.refusals and not record.timed_out
    prompt = prompt_token_ids(engine.tokenizer, Problem(id="p", prompt="hi", answer=""), chat_template=True)
    assert list(record.calls[0].prompt_ids) == prompt
    for index, call in enumerate(record.calls):  # each call samples as the engine does alone, from its own seed
        alone = engine.continue_from([list(call.prompt_ids)], replace(SAMPLING, seed=derive_seed(11, "call", index)))
        assert (call.completion.token_ids, call.completion.logprobs) == (alone[0][0].token_ids, alone[0][0].logprobs)
    assert [e.logprob for e in first.choices[0].logprobs.content] == list(record.calls[0].completion.logprobs)
    for trajectory in record.trajectories():  # generated tokens are the calls' own, in order, the rest inserted
        sequence = [*trajectory.prompt_ids, *trajectory.token_ids]
        generated = [t for t, m in zip(trajectory.token_ids, trajectory.loss_mask) if m]
        own = [c for c in record.calls if list(c.prompt_ids) == sequence[:len(c.prompt_ids)]]
        assert generated == [t for c in own for t in c.completion.token_ids]


def test_a_reply_the_template_renders_as_sampled_merges_and_a_rewritten_one_does_not(tiny_model_dir):
    for template, merged in ((None, True), (THINK_STRIPPING_TEMPLATE, False)):
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
        tokenizer.chat_template = template or tokenizer.chat_template
        engine = ScriptedPrefixEngine(tokenizer, lambda prompt: "<think>hm</think>42")
        with AgentEndpoint(engine, "tiny") as endpoint:
            episode = endpoint.open_episode(replace(SAMPLING, max_new_tokens=40), seed=0, timeout_s=60)
            messages = [{"role": "user", "content": "q"}]
            reply = chat(episode.base_url, messages, max_tokens=40).choices[0].message.content
            chat(episode.base_url, [*messages, {"role": "assistant", "content": reply},
                                    {"role": "user", "content": "again"}], max_tokens=40)
            trajectories = episode.finish().trajectories()
        sampled = tuple(tokenizer("<think>hm</think>42", add_special_tokens=False)["input_ids"]) + (1,)
        if merged:
            (one,) = trajectories
            inserted = tuple(tokenizer("<|user|>again<eos><|assistant|>", add_special_tokens=False)["input_ids"])
            assert one.token_ids == sampled + inserted + sampled
            assert one.loss_mask == (1,) * len(sampled) + (0,) * len(inserted) + (1,) * len(sampled)
        else:  # the history lost the <think> block: the second call is a sample of its own, with its real prompt
            first, second = trajectories
            assert first.token_ids == second.token_ids == sampled and set(first.loss_mask) == {1}
            assert "<think>" not in tokenizer.decode(list(second.prompt_ids))


def test_refusals_are_4xx_and_kept_in_the_record(engine):
    with AgentEndpoint(engine, "tiny") as endpoint:
        episode = endpoint.open_episode(SAMPLING, seed=0, timeout_s=60)
        messages = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.NotFoundError, match="'other' does not exist"):
            chat(episode.base_url, messages, model="other")
        with pytest.raises(openai.BadRequestError, match="'temperature'=0.2 differs"):
            chat(episode.base_url, messages, temperature=0.2)
        with pytest.raises(openai.BadRequestError, match="'seed' is not taken"):
            chat(episode.base_url, messages, seed=3)
        chat(episode.base_url, messages, temperature=1.0, max_tokens=1000)  # the episode's own value; a cap
        record = episode.finish()
        assert len(record.refusals) == 3 and len(record.calls) == 1
        assert len(record.calls[0].completion.token_ids) <= SAMPLING.max_new_tokens
        with pytest.raises(openai.APIStatusError, match="this episode is over") as finished:
            chat(episode.base_url, messages)
        assert finished.value.status_code == 410
        late = endpoint.open_episode(SAMPLING, seed=0, timeout_s=0.2)
        time.sleep(0.3)
        with pytest.raises(openai.APIStatusError, match=r"time \(0.2 s\) is over") as expired:
            chat(late.base_url, messages)
        assert expired.value.status_code == 410 and late.finish().timed_out


def test_concurrent_episodes_go_to_the_engine_together_and_n_gives_a_call_each(engine):
    with AgentEndpoint(engine, "tiny", batch_window_s=5.0) as endpoint:
        episodes = [endpoint.open_episode(SAMPLING, seed=i, timeout_s=60) for i in range(4)]
        before = len(engine.batches)
        threads = [threading.Thread(target=chat, args=(e.base_url, [{"role": "user", "content": f"q{i}"}]))
                   for i, e in enumerate(episodes)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert engine.batches[before:] == [4] and time.monotonic() - started < 5.0  # every open episode waited
        for episode in episodes[1:]:
            episode.finish()  # else the next request would wait for them, the window long
        reply = chat(episodes[0].base_url, [{"role": "user", "content": "q"}], n=2)
        assert len(reply.choices) == 2 and len(episodes[0].finish().calls) == 3


# ---------------------------------------------------------------------------- the engine front


def test_what_is_trained_is_what_was_sampled(engine, tiny_model_dir):
    problems = [Problem(id=str(i), prompt=f"task {i}", answer="") for i in range(2)]
    for agent in (two_calls, two_calls_async):
        front = OpenAIAgentEngine(engine, agent, model_name="tiny", timeout_s=60)
        engine.sampled = []
        groups = front.generate(problems, replace(SAMPLING, n=3, seed=4))
        front.endpoint.close()
        assert all(g.failures == () for g in groups) and sum(g.size for g in groups) >= 6
        batch = make_train_batch(groups, [1.0] * sum(g.size for g in groups), engine.pad_id)
        row = 0
        for group in groups:
            for completion in group.completions:
                sequence = [*group.prompt_ids, *completion.token_ids]
                mask = [0] * len(group.prompt_ids) + list(completion.loss_mask or [1] * len(completion.token_ids))
                assert batch.input_ids_NT[row, :len(sequence)].tolist() == sequence
                # The generated spans are exactly what the engine sampled after exactly that prefix.
                start = 0
                while start < len(sequence):
                    if not mask[start]:
                        start += 1
                        continue
                    end = next((i for i in range(start, len(sequence)) if not mask[i]), len(sequence))
                    assert any(p == sequence[:start] and list(c.token_ids) == sequence[start:end]
                               for p, c in engine.sampled), (sequence, start, end)
                    start = end
                row += 1
        # The recorded log-probs are the engine's, which the learner recomputes (float32: to rounding).
        learner_NT, _ = token_logprobs(engine.model, batch, SAMPLING.temperature)
        where = batch.loss_mask_NT.bool()
        assert any(c.calls == 2 and 0 in c.loss_mask for g in groups for c in g.completions)  # merged calls
        torch.testing.assert_close(learner_NT[where], batch.sampling_logp_NT[where], atol=1e-5, rtol=0)


def flaky(base_url, model, problem):
    """Fails in every way an agent can, by problem: raises, hangs, sends a malformed request (and swallows
    the 400), returns no number, makes no call; problem "ok" plays one call."""
    kind = problem.id
    if kind == "hangs":
        time.sleep(30)
    if kind == "no_call":
        return 1.0
    messages = [{"role": "user", "content": problem.prompt}]
    if kind == "malformed":
        try:
            chat(base_url, [{"role": "robot", "content": "?"}])
        except openai.BadRequestError:
            pass
    chat(base_url, messages)
    if kind == "raises":
        raise ValueError("the agent's own bug")
    return "not a number" if kind == "no_number" else 0.5


def test_failing_episodes_are_lost_alone_and_on_error_stop_stops(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = ScriptedPrefixEngine(tokenizer, lambda prompt: "fine")
    kinds = ["ok", "raises", "hangs", "malformed", "no_number", "no_call"]
    problems = [Problem(id=kind, prompt=f"do {kind}", answer="") for kind in kinds]
    # Long enough for the quick episodes on a loaded machine; the hanging one sleeps 30 s.
    front = OpenAIAgentEngine(engine, flaky, model_name="tiny", timeout_s=10.0)
    groups = front.generate(problems, replace(SAMPLING, n=2))
    ok = groups[0]
    assert ok.failures == () and ok.size == 2 and [c.reward for c in ok.completions] == [0.5, 0.5]
    reasons = {g.problem.id: g.failures for g in groups[1:]}
    assert all(len(failures) == 2 and g.size == 0 for g, failures in zip(groups[1:], reasons.values()))
    assert "ValueError: the agent's own bug" in reasons["raises"][0] and "test_agent_endpoint.py" in reasons["raises"][0]
    assert reasons["hangs"][0] == "episode 0: did not finish within 10 s"
    assert "refused" in reasons["malformed"][0] and "'role' among" in reasons["malformed"][0]
    assert "it must return the episode's reward" in reasons["no_number"][0]
    assert "made no request to the model" in reasons["no_call"][0]

    stopping = OpenAIAgentEngine(engine, flaky, model_name="tiny", timeout_s=5, on_error="stop")
    with pytest.raises(AgentEpisodeError, match="episode 0 of problem 'raises': ValueError"):
        stopping.generate(problems[:2], replace(SAMPLING, n=1))
    with pytest.raises(AgentEpisodeError, match="every episode .* failed"):
        front.generate(problems[1:2], replace(SAMPLING, n=2))
    front.close()
    stopping.close()


def test_a_failing_engine_is_not_the_agents_failure(tiny_model_dir):
    class Broken(ScriptedPrefixEngine):
        def continue_from(self, prefixes, sampling, seeds=None):
            raise MemoryError("out of memory")

    front = OpenAIAgentEngine(Broken(AutoTokenizer.from_pretrained(tiny_model_dir), str), flaky, model_name="tiny",
                              timeout_s=5)
    with pytest.raises(RuntimeError, match="the rollout engine failed .* out of memory"):
        front.generate([Problem(id="ok", prompt="x", answer="")], SAMPLING)
    front.close()


# ---------------------------------------------------------------------------- training


def test_a_two_call_openai_agent_trains_a_tiny_model(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", "train.steps=16", "run.log_every=0",
                      f"task.agent={__name__}:two_calls")
    train(cfg, task=TASK)
    rewards = [m["reward/agent"] for m in step_metrics(tmp_path / "run")]
    # The answer's share of 'a' starts near 0.01; 16 steps take it to about 0.4.
    assert sum(rewards[-4:]) / 4 > sum(rewards[:3]) / 3 + 0.2, rewards
    assert all(m["env/failed"] == 0 for m in step_metrics(tmp_path / "run"))
    records = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert records and all(r["components"] == {"agent": r["reward"]} for r in records)


calls = iter(range(1 << 30))
calls_lock = threading.Lock()


def fails_every_fourth(base_url, model, problem):
    with calls_lock:
        number = next(calls)
    if number % 4 == 0:
        raise RuntimeError(f"episode number {number} fails")
    return two_calls(base_url, model, problem)


def test_a_run_loses_failed_episodes_only_and_logs_them(tiny_model_dir, tmp_path):
    agent = f"task.agent={__name__}:fails_every_fourth"
    train(tiny_config(tiny_model_dir, tmp_path / "run", "train.steps=2", agent), task=TASK)
    assert [m["env/failed"] for m in step_metrics(tmp_path / "run")] == [8.0, 8.0]  # 32 episodes a step
    records = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    failed = [r for r in records if r.get("error")]
    assert len(failed) == 16 and all("RuntimeError: episode number" in r["error"] and r["completion"] is None
                                     for r in failed)
    with pytest.raises(AgentEpisodeError, match="RuntimeError: episode number"):
        train(tiny_config(tiny_model_dir, tmp_path / "stop", "train.steps=2", agent, "task.on_error=stop"), task=TASK)

