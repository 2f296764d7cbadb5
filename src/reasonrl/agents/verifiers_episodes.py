"""verifiers environments that play their own episodes (several turns, tools, several agents),
trained through the endpoint that serves the policy (task.name=verifiers; docs/environments.md).

Such an environment runs as verifiers runs it: its `Env.run_episode` on the task, its harness and
tools, within `Env.serving()` (its interception server, its shared tool servers), the model being
reached at a base URL. `VerifiersEpisode` is that as an agent of `OpenAIAgentEngine`
(reasonrl.agents.openai_agents): called with the endpoint's base URL for the episode, the served
model's name and the problem, it plays the problem's task and returns the episode's reward (the
weighted sum of its rewards and judges, over the traces of its trainable agents). The endpoint records every call's token
ids and log-probs: they are what is trained; the text the environment inserts between them (tool
results, user turns) is masked from the loss. An episode that verifiers reports as failed (its
errors) is a failed episode (task.on_error).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from reasonrl.types import Problem

KEY_VARIABLE = "REASONRL_ENDPOINT_KEY"  # the endpoint takes no key; verifiers sends "EMPTY" when this is unset


class VerifiersEpisode:
    """An agent (base_url, model, problem) -> reward that plays `tasks[problem.id]` in `env`."""

    def __init__(self, env: Any, tasks: Mapping[str, Any]):
        self.env, self.tasks = env, tasks

    async def __call__(self, base_url: str, model: str, problem: Problem) -> float:
        import verifiers.v1 as vf

        task = self.tasks[problem.id]
        context = vf.ModelContext(model=model, client=vf.EvalClientConfig(base_url=base_url,
                                                                          api_key_var=KEY_VARIABLE))
        env = copy.copy(self.env)  # serving() holds its interception and tool servers on the env: one per episode
        async with env.serving():
            episode = await env.run_episode(task, context)
        if not env.complete(episode):
            errors = [*episode.errors, *(error for trace in episode.traces for error in trace.errors)]
            raise RuntimeError("the verifiers episode failed: " + ("; ".join(f"{e.type}: {e.message}" for e in errors)
                                                                   or "no error recorded"))
        return sum(trace.reward for trace in episode.traces if trace.agent.trainable)
