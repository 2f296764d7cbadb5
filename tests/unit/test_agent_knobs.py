"""task.agent's knobs: what applies only with an agent, what an agent leaves without effect, and what
it cannot be combined with, refused with the fix; its reward is the float the agent returns."""

from __future__ import annotations

import pytest

from reasonrl import load_config
from reasonrl.build import build_weighted_reward
from reasonrl.config import ConfigError
from reasonrl.types import Problem

NOT_CALLABLE = 3


def agent(base_url, model, problem):
    return 1.0


def with_agent(*extra: str):
    return load_config(overrides=[f"task.agent={__name__}:agent", *extra])


def test_an_agent_is_taken_with_its_knobs():
    cfg = with_agent("task.agent_timeout_s=5", "task.on_error=stop")
    assert (cfg.task.agent_timeout_s, cfg.task.on_error) == (5.0, "stop")


@pytest.mark.parametrize(("overrides", "message"), [
    (["task.on_error=stop"], "task.on_error='stop' has no effect: task.on_error applies only when task.agent is set"),
    ([f"task.agent={__name__}:agent", "reward.format_weight=0.5"],
     "reward.format_weight=0.5 has no effect: .* applies only when task.agent is not set"),
    (["task.agent=agent"], "must name your function as 'package.module:function'"),
    (["task.agent=no_such_module_here:agent"], "task.agent: cannot import module 'no_such_module_here'"),
    ([f"task.agent={__name__}:NOT_CALLABLE"], "is a int: expected a function"),
    ([f"task.agent={__name__}:agent", "agent.environment=python_math"], "set agent.environment=''"),
    ([f"task.agent={__name__}:agent", "run.backend=ray"], "set run.backend=local"),
    ([f"task.agent={__name__}:agent", "sampling.replay=2"], "set sampling.replay=0"),
])
def test_what_an_agent_cannot_use_or_be_combined_with_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)


def test_the_reward_is_the_agents_float_and_no_other():
    from reasonrl.agents.openai_agents import AgentCompletion

    reward = build_weighted_reward(with_agent())
    completions = [AgentCompletion(token_ids=(1,), text="", logprobs=(0.0,), finish_reason="stop", reward=r)
                   for r in (0.25, 1.0)]
    scores = reward.score_group(Problem(id="p", prompt="x", answer=""), completions)
    assert reward.names == ("agent",) and scores.totals == (0.25, 1.0)
    with pytest.raises(ConfigError, match="scored by the float the agent returns"):
        build_weighted_reward(with_agent(), lambda text, problem: 1.0)
