"""The built-in task: sums of a few random integers ("What is 23 + 58?").

Small models get it partly right, so the reward is informative from the first step and a
learning run finishes in minutes on a CPU. Train and test problems never share an expression.
Each problem carries a worked solution in metadata["solution"] (for supervised guidance).
"""

from __future__ import annotations

import random

from reasonrl.tasks.base import Task
from reasonrl.types import Problem


def arithmetic_task(*, train_size: int, test_size: int, digits: int = 2, operands: int = 2, seed: int = 0,
                    prompt_template: str = "{prompt}") -> Task:
    """`train_size` + `test_size` distinct sums of `operands` numbers with `digits` digits."""
    low, high = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1
    distinct = (high - low + 1) ** operands
    if train_size + test_size > distinct:
        raise ValueError(f"only {distinct} distinct sums of {operands} {digits}-digit numbers; "
                         f"asked for {train_size} + {test_size}")
    rng = random.Random(f"arithmetic-{seed}-{digits}-{operands}")
    seen: set[tuple[int, ...]] = set()
    problems = []
    while len(problems) < train_size + test_size:
        numbers = tuple(rng.randint(low, high) for _ in range(operands))
        if numbers in seen:
            continue
        seen.add(numbers)
        expression = " + ".join(map(str, numbers))
        solution = f"{expression} = {sum(numbers)}. The answer is \\boxed{{{sum(numbers)}}}."
        problems.append(Problem(id=f"sum-{len(problems)}", prompt=prompt_template.format(prompt=f"What is {expression}?"),
                                answer=str(sum(numbers)),
                                metadata={"numbers": list(numbers), "answer_type": "number", "solution": solution}))
    return Task(name="arithmetic", train=problems[:train_size], test=problems[train_size:])
