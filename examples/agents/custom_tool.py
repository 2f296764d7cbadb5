"""A user's Python function as a tool, in a user environment, trained with GRPO over episodes.

The model is asked for the price of an order and can call `price(item, quantity)`; the final
answer in \\boxed{} is checked by the math verifier. Run from the repository root:

    python examples/agents/custom_tool.py model.name=PATH_OR_HUB_ID train.steps=20
"""

from __future__ import annotations

import random
import sys

from reasonrl import Problem, Task, load_config, train
from reasonrl.agents import FunctionTool, ToolEnvironment
from reasonrl.rewards import MathReward

PRICES = {"apple": 3, "pear": 4, "melon": 11, "lemon": 2}


def price(item: str, quantity: int) -> str:
    """Total price in euros of `quantity` pieces of `item` (apple, pear, melon or lemon)."""
    if item not in PRICES:
        raise ValueError(f"unknown item {item!r}; items: {', '.join(PRICES)}")
    return f"{PRICES[item] * quantity} euros"


def make_environment() -> ToolEnvironment:
    """Called once per episode (agent.environment = "custom_tool:make_environment")."""
    schema = {"type": "object", "required": ["item", "quantity"],
              "properties": {"item": {"type": "string", "enum": list(PRICES)}, "quantity": {"type": "integer"}}}
    return ToolEnvironment([FunctionTool(price, parameters=schema)], MathReward(), tool_format="tags", max_turns=3,
                           invalid_call_reward=-0.1, tool_bonus=0.1)


def task(size: int, seed: int) -> list[Problem]:
    rng = random.Random(seed)
    problems = []
    for i in range(size):
        item, quantity = rng.choice(list(PRICES)), rng.randint(2, 40)
        problems.append(Problem(id=f"{seed}-{i}", prompt=f"How much do {quantity} {item}s cost, in euros? "
                                "Put the number in \\boxed{}.", answer=str(PRICES[item] * quantity)))
    return problems


if __name__ == "__main__":
    sys.path.insert(0, __file__.rsplit("/", 1)[0])  # so that "custom_tool:make_environment" imports
    cfg = load_config(overrides=["agent.environment=custom_tool:make_environment", "agent.tool_format=tags",
                                 "rollout.max_new_tokens=96", "agent.max_episode_tokens=320",
                                 "run.dir=runs/custom-tool",
                                 *sys.argv[1:]])
    train(cfg, task=Task(name="prices", train=task(500, 0), test=task(50, 1)))
