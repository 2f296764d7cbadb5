"""OpenEnv environments (task.name=openenv) against a server this module starts on 127.0.0.1 with
openenv-core's own server (create_fastapi_app under uvicorn): the adapter speaks the protocol
(reset with the problem's seed, actions in the action's field, observations as text, rewards and
done), closes each episode's session; typed clients get typed actions; training on it learns (and a
flipped sign does not); the trained tokens are the sampled ones, with the engine's log-probs; an
environment that raises or hangs loses its episode only (env/failed, rollouts.jsonl), or stops the
run with task.on_error=stop."""

from __future__ import annotations

import itertools
import json
import socket
import string
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import step_metrics, tiny_config

pytest.importorskip("openenv.core")
uvicorn = pytest.importorskip("uvicorn")

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app

from reasonrl import Problem, train
from reasonrl.agents import AgentEngine
from reasonrl.agents.engine import EnvironmentFailed
from reasonrl.agents.openenv import OpenEnvEnvironment, action_for, connect_url, observation_text
from reasonrl.rollout import HFEngine
from reasonrl.training.learner import make_train_batch
from reasonrl.training.token_stats import token_logprobs
from reasonrl.types import SamplingParams


class PingAction(Action):
    message: str


class PingObservation(Observation):
    text: str
    turn: int = 0


class PingEnvironment(Environment):
    """Two steps; each step whose message holds the letter 'a' earns 1. Seeds 13 and 14 misbehave:
    13 raises on its first step, 14 takes 3 s to answer it (the tests' timeout is shorter)."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    open_sessions = 0

    def __init__(self) -> None:
        super().__init__()
        self.seed, self.turn = 0, 0
        PingEnvironment.open_sessions += 1

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> PingObservation:
        self.seed, self.turn = seed or 0, 0
        return PingObservation(text=f"game {self.seed % 5}: say a word")

    def step(self, action: PingAction, timeout_s: float | None = None, **kwargs: Any) -> PingObservation:
        self.turn += 1
        if self.seed == 13:
            raise RuntimeError("the game crashed")
        if self.seed == 14:
            time.sleep(3)
        return PingObservation(text="pong", turn=self.turn, reward=float("a" in action.message), done=self.turn == 2)

    @property
    def state(self) -> State:
        return State(step_count=self.turn)

    def close(self) -> None:
        PingEnvironment.open_sessions -= 1


class PingClient(EnvClient[PingAction, PingObservation, State]):
    """A typed client, as an environment's own package ships one."""

    def _step_payload(self, action: PingAction) -> dict[str, Any]:
        return {"message": action.message}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[PingObservation]:
        observation = PingObservation(**payload["observation"], reward=payload.get("reward"),
                                      done=payload.get("done", False))
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(**payload)


SERVER: dict[str, str] = {}


def ping_client(**kwargs: Any) -> PingClient:
    """task.env's factory: a typed client of the module's server."""
    return PingClient(base_url=SERVER["url"], **kwargs)


@pytest.fixture(scope="module")
def server_url():
    app = create_fastapi_app(PingEnvironment, PingAction, PingObservation, max_concurrent_envs=256)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    SERVER["url"] = f"http://127.0.0.1:{port}"
    yield SERVER["url"]
    server.should_exit = True
    thread.join(10)


def wait_for_sessions(count: int) -> None:
    deadline = time.monotonic() + 10
    while PingEnvironment.open_sessions != count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert PingEnvironment.open_sessions == count


def test_an_episode_speaks_the_protocol_and_closes_its_session(server_url):
    before = PingEnvironment.open_sessions
    env = OpenEnvEnvironment(lambda: connect_url(server_url))
    assert env.reset(Problem(id="p", prompt="", answer="", metadata={"seed": 7})) == "game 2: say a word"
    first = env.step("banana")
    assert (first.observation, first.reward, first.done) == ("pong", 1.0, False)
    second = env.step("hello")
    assert (second.observation, second.reward, second.done) == ("pong", 0.0, True)
    wait_for_sessions(before + 1)
    env.close()
    wait_for_sessions(before)


def test_an_episode_without_any_reward_is_warned_about_once(monkeypatch, caplog):
    class Unrewarding:
        def reset(self, **kwargs: Any) -> Any:
            return StepResult(observation={"text": "go"}, reward=None, done=False)

        def step(self, action: Any) -> Any:
            return StepResult(observation={"text": "ok"}, reward=None, done=True)

        def close(self) -> None:
            pass

    class RewardingAtTheEnd(Unrewarding):
        def step(self, action: Any) -> Any:
            return StepResult(observation={"text": "ok"}, reward=0.0, done=True)

    monkeypatch.setattr(OpenEnvEnvironment, "warned_unrewarded", False)
    env = OpenEnvEnvironment(RewardingAtTheEnd)
    env.reset(Problem(id="p", prompt="", answer=""))
    assert env.step("hi").reward == 0.0 and not caplog.records  # a reward of 0 is a reward
    for _ in range(2):
        env = OpenEnvEnvironment(Unrewarding)
        env.reset(Problem(id="p", prompt="", answer=""))
        assert env.step("hi").reward == 0.0
    assert [r.getMessage() for r in caplog.records].count(
        "an OpenEnv episode ended with no reward on any step (each step's reward was None, counted 0): if the server "
        "never sets one, every episode scores 0 and nothing is learned") == 1


def test_a_typed_client_gets_its_typed_action(server_url):
    client = ping_client()
    action = action_for(client, "message", "aha")
    assert isinstance(action, PingAction) and action.message == "aha"
    assert action_for(object(), "message", "aha") == {"message": "aha"}
    env = OpenEnvEnvironment(ping_client)
    env.reset(Problem(id="p", prompt="", answer="", metadata={"seed": 1}))
    assert env.step("a").reward == 1.0
    env.close()


def test_an_observation_is_read_as_text():
    assert observation_text({"text": "hi", "turn": 2}) == "hi"  # the only text field
    assert observation_text({"board": "x.o", "legal": "a1"}) == '{"board": "x.o", "legal": "a1"}'
    assert observation_text({"board": "x.o", "legal": "a1"}, "legal") == "a1"
    assert observation_text(PingObservation(text="hi", reward=1.0, done=True, metadata={"k": "v"})) == "hi"
    with pytest.raises(KeyError, match="no field 'prompt'.*text, turn"):
        observation_text({"text": "hi", "turn": 2}, "prompt")


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return HFEngine(model, AutoTokenizer.from_pretrained(tiny_model_dir))


def seeded(*seeds: int) -> list[Problem]:
    return [Problem(id=f"s{s}", prompt="", answer="", metadata={"seed": s}) for s in seeds]


def test_episodes_train_on_the_sampled_tokens_with_the_engine_logprobs(server_url, engine):
    episodes = AgentEngine(engine, lambda: OpenEnvEnvironment(lambda: connect_url(server_url)), max_turns=2,
                           observation_template="<{observation}>", on_error="skip", env_timeout_s=30)
    before = PingEnvironment.open_sessions
    # Turns end early at any lower-case letter (3 in 4 turns), so observations are inserted (asserted below).
    groups = episodes.generate(seeded(1, 2), SamplingParams(n=3, temperature=1.0, max_new_tokens=5, seed=3,
                                                            stop=tuple(string.ascii_lowercase)))
    wait_for_sessions(before)  # every episode's session is closed
    assert all(group.failures == () for group in groups)
    for group, seed in zip(groups, (1, 2)):  # the first observation is the prompt
        assert f"game {seed}: say a word" in engine.tokenizer.decode(list(group.prompt_ids))
    batch = make_train_batch(groups, [0.0] * 6, engine.pad_id)
    with torch.no_grad():
        logp_NT, _ = token_logprobs(engine.model, batch, 1.0)
    mask = batch.loss_mask_NT.bool()
    inserted = sum(len(c.token_ids) - sum(c.loss_mask) for g in groups for c in g.completions)
    assert mask.sum() == sum(sum(c.loss_mask) for g in groups for c in g.completions) and inserted > 0
    torch.testing.assert_close(logp_NT[mask], batch.sampling_logp_NT[mask], atol=1e-4, rtol=1e-4)
    for n, completion in enumerate(c for g in groups for c in g.completions):
        prompt = len(groups[n // 3].prompt_ids)
        trained = batch.input_ids_NT[n, prompt:prompt + len(completion.token_ids)].tolist()
        assert trained == list(completion.token_ids)  # the ids sampled and inserted, never re-tokenised
        episode = completion.episode
        assert episode.reward == sum(turn.reward for turn in episode.turns)


def test_an_environment_that_raises_or_hangs_loses_its_episode_only(server_url, engine):
    episodes = AgentEngine(engine, lambda: OpenEnvEnvironment(lambda: connect_url(server_url)), max_turns=2,
                           on_error="skip", env_timeout_s=1.0)
    groups = episodes.generate(seeded(1, 13, 14), SamplingParams(n=2, temperature=1.0, max_new_tokens=4, seed=1))
    assert [len(g.completions) for g in groups] == [2, 0, 0]
    assert groups[0].failures == ()
    assert all("step: RuntimeError: Server error: the game crashed" in f for f in groups[1].failures)
    assert [f.split(":", 1)[0] for f in groups[2].failures] == ["episode 0", "episode 1"]
    assert all("no answer within 1 s" in f for f in groups[2].failures)
    stopping = AgentEngine(engine, lambda: OpenEnvEnvironment(lambda: connect_url(server_url)), max_turns=2)
    with pytest.raises(RuntimeError, match="the game crashed"):
        stopping.generate(seeded(13), SamplingParams(n=1, max_new_tokens=4))
    with pytest.raises(EnvironmentFailed, match="every episode .2. failed"):
        episodes.generate(seeded(13), SamplingParams(n=2, max_new_tokens=4))


def negated_grpo(rewards_BG: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    from reasonrl.algo.advantages import grpo

    return -grpo(rewards_BG, eps=eps)


def openenv_config(model_dir: Path, run_dir: Path, *extra: str):
    # A turn ends after its 'a', so that the episode goes on to its second step.
    return tiny_config(model_dir, run_dir, "task.name=openenv", "task.train_size=64", "task.test_size=4",
                       "rollout.max_new_tokens=6", "train.steps=14", "run.log_every=0", 'rollout.stop=["a"]',
                       "agent.max_turns=2", "agent.observation_template={observation}", *extra)


def test_training_on_an_openenv_server_learns_and_a_flipped_sign_does_not(server_url, tiny_model_dir, tmp_path):
    train(openenv_config(tiny_model_dir, tmp_path / "up", f"task.env_url={server_url}"))
    rewards = [m["reward/mean"] for m in step_metrics(tmp_path / "up")]
    # Two steps of reward 1 at most; a random tiny model writes the letter now and then at first.
    assert sum(rewards[-4:]) / 4 > sum(rewards[:3]) / 3 + 0.5, rewards
    assert all(m["env/failed"] == 0 for m in step_metrics(tmp_path / "up"))
    train(openenv_config(tiny_model_dir, tmp_path / "down", f"task.env={__name__}:ping_client",
                         f"algo.advantage={__name__}:negated_grpo"))
    down = [m["reward/mean"] for m in step_metrics(tmp_path / "down")]
    assert sum(down[-4:]) / 4 <= sum(rewards[:3]) / 3 + 0.1, down


CLIENTS = itertools.count()


class CrashingClient(PingClient):
    def _step_payload(self, action: PingAction) -> dict[str, Any]:
        raise RuntimeError("the game crashed")


def crashing_client(**kwargs: Any) -> PingClient:
    """A client whose every fourth episode crashes on its first step (two episodes of each group of 8)."""
    return CrashingClient(base_url=SERVER["url"]) if next(CLIENTS) % 4 == 3 else ping_client()


def test_a_run_goes_on_past_failing_episodes_and_shows_them(server_url, tiny_model_dir, tmp_path):
    cfg = openenv_config(tiny_model_dir, tmp_path, f"task.env={__name__}:crashing_client", "train.steps=2")
    train(cfg)
    failed = [m["env/failed"] for m in step_metrics(tmp_path)]
    rollouts = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    errors = [r for r in rollouts if r.get("error")]
    assert sum(failed) == len(errors) > 0
    assert all("the game crashed" in r["error"] and r["completion"] is None for r in errors)
    assert len(rollouts) == 2 * 4 * 8 and len(errors) == 2 * 8  # each error in place of its episode
    with pytest.raises(RuntimeError, match="the game crashed"):
        train(openenv_config(tiny_model_dir, tmp_path / "stop", f"task.env={__name__}:crashing_client",
                             "train.steps=2", "task.on_error=stop"))
