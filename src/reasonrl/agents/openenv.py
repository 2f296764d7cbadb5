"""OpenEnv environments (openenv-core, `pip install -e '.[openenv]'` in the checkout) played as episodes:
task.name=openenv (docs/environments.md).

An OpenEnv environment runs behind a server; a client holds one session of it (its own instance of
the environment): `reset(seed=...)` gives the first observation, `step(action)` the next one, a
reward and whether the episode is over. `OpenEnvEnvironment` adapts a client to the `Environment`
protocol of reasonrl.agents, so that `AgentEngine` plays the episodes:

- the first observation is the prompt (the user message, through the chat template);
- each model turn is the action `{action_field: the turn's text}` (validated into the client's
  action type when the client declares one, as typed clients such as `EchoEnv` do);
- each later observation is inserted into the episode as text, masked from the loss;
- each step's reward is the turn's, the episode's reward their sum (`EpisodeReward`). A step without
  one (reward None, as on the intermediate steps of an environment that rewards the end) counts 0; an
  episode that ends with no reward on any step is warned about once, since a server that never sets
  one would otherwise train on zeros without a word.

An observation becomes text by its `observation_field`, or when none is named, its only text field
(`done`, `reward` and `metadata` aside), else all of it as JSON. A problem is an episode seed: the G
episodes of a group reset with the same seed, so that they start from the same observation (an
environment that ignores the seed must start the same way every time). A session is opened per
episode and closed when it is over: the server must allow rollout.prompts_per_step x
rollout.group_size sessions at once (max_concurrent_envs, for an environment that declares
SUPPORTS_CONCURRENT_SESSIONS).
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from reasonrl.agents.environment import StepResult
from reasonrl.registry import import_object, json_arguments
from reasonrl.types import Problem

if TYPE_CHECKING:  # the config is read, not imported: it sits above the agents
    from reasonrl.config import TaskConfig

OBSERVATION_TEMPLATE = "\n<observation>\n{observation}\n</observation>\n"
"""How an OpenEnv observation is inserted after a model turn (agent.observation_template overrides it)."""

SERVER_FIELDS = ("done", "reward", "metadata")  # an Observation's own fields, not what the model reads

logger = logging.getLogger(__name__)


class OpenEnvEnvironment:
    """One episode of an OpenEnv environment through a client that `connect()` opens (a session)."""

    def __init__(self, connect: Callable[[], Any], *, action_field: str = "message", observation_field: str = ""):
        self.connect, self.action_field, self.observation_field = connect, action_field, observation_field
        self.client: Any = None
        self.rewarded = False  # some step of this episode gave a reward

    warned_unrewarded = False  # one warning per process (class-wide)

    def reset(self, problem: Problem) -> str:
        self.client, self.rewarded = synchronous(self.connect()), False
        seed = problem.metadata.get("seed")
        result = self.client.reset(**({} if seed is None else {"seed": seed}))
        return observation_text(result.observation, self.observation_field)

    def step(self, action: str) -> StepResult:
        if self.client is None:
            raise RuntimeError("OpenEnvEnvironment.step before reset(problem)")
        result = self.client.step(action_for(self.client, self.action_field, action))
        self.rewarded |= result.reward is not None
        if result.done and not self.rewarded:
            self._warn_unrewarded()
        reward = 0.0 if result.reward is None else float(result.reward)
        return StepResult(observation_text(result.observation, self.observation_field), reward, bool(result.done))

    @staticmethod
    def _warn_unrewarded() -> None:
        if not OpenEnvEnvironment.warned_unrewarded:  # the class's own flag: once per process, subclasses too
            OpenEnvEnvironment.warned_unrewarded = True
            logger.warning("an OpenEnv episode ended with no reward on any step (each step's reward was None, "
                           "counted 0): if the server never sets one, every episode scores 0 and nothing is learned")

    def close(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            client.close()


def synchronous(client: Any) -> Any:
    """The client with blocking methods: openenv-core 0.3's clients are asynchronous, with `.sync()`."""
    if inspect.iscoroutinefunction(getattr(client, "step", None)) and hasattr(client, "sync"):
        return client.sync()
    return client


def connect_url(url: str) -> Any:
    """A client of the server at `url` that sends actions and reads observations as plain dicts."""
    try:
        from openenv.core import GenericEnvClient
    except ImportError as exc:
        raise ImportError("task.name=openenv needs openenv-core: pip install -e '.[openenv]' in the reasonrl checkout "
                          "(or pip install 'openenv-core>=0.2.1')") from exc
    return GenericEnvClient(base_url=url)


def action_type(client: Any) -> Any:
    """The action class the client's type declares (EnvClient[Action, Observation, State]), or None."""
    wrapped = getattr(client, "_async", client)  # 0.3's synchronous wrapper holds the client it wraps
    for klass in type(wrapped).__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            arguments = getattr(base, "__args__", ())
            if arguments and isinstance(arguments[0], type) and hasattr(arguments[0], "model_validate"):
                return arguments[0]
    return None


def action_for(client: Any, field: str, text: str) -> Any:
    """The action of a model turn: {field: text}, validated into the client's action type if it has one."""
    declared = action_type(client)
    return {field: text} if declared is None else declared.model_validate({field: text})


def observation_text(observation: Any, field: str = "") -> str:
    """What the model reads of an observation (module docstring)."""
    data = observation.model_dump() if hasattr(observation, "model_dump") else observation
    if not isinstance(data, Mapping):
        return data if isinstance(data, str) else json.dumps(data)
    data = {key: value for key, value in data.items() if key not in SERVER_FIELDS}
    if field:
        if field not in data:
            raise KeyError(f"the observation has no field {field!r} (task.observation_field); its fields: "
                           f"{', '.join(data) or 'none'}")
        value = data[field]
        return value if isinstance(value, str) else json.dumps(value)
    texts = [value for value in data.values() if isinstance(value, str)]
    return texts[0] if len(texts) == 1 else json.dumps(data)


def openenv_environments(t: TaskConfig) -> Callable[[], OpenEnvEnvironment]:
    """A fresh OpenEnvEnvironment per episode, reaching the environment task.env_url or task.env names."""
    if t.env_url:
        connect: Callable[[], Any] = partial(connect_url, t.env_url)
    else:
        connect = partial(import_object(t.env), **json_arguments(t.env_args, "task.env_args"))
    return partial(OpenEnvEnvironment, connect, action_field=t.action_field, observation_field=t.observation_field)
