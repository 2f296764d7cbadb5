"""The tasks task.name can name: each entry builds the Task from the config's task section and
the run's seed. A new built-in task is a function here and a line in `TASKS` (its name is then
one of task.name's choices)."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from reasonrl.seeds import derive_seed31
from reasonrl.tasks.arithmetic import arithmetic_task
from reasonrl.tasks.base import Task
from reasonrl.tasks.benchmarks import BENCHMARKS, benchmark_task
from reasonrl.tasks.environments import environment_from_spec, environment_task, leveled_environment_task
from reasonrl.tasks.humaneval import HUMANEVAL_SIZE, HUMANEVAL_TEMPLATE, humaneval_task
from reasonrl.tasks.verifiers_env import verifiers_task
from reasonrl.types import Problem

if TYPE_CHECKING:  # the config's schema lists these tasks' names: it is not imported back at run time
    from reasonrl.config import TaskConfig


def arithmetic(t: TaskConfig, seed: int) -> Task:
    return arithmetic_task(train_size=t.train_size, test_size=t.test_size, digits=t.digits, operands=t.operands,
                           seed=seed, prompt_template=t.prompt_template)


def humaneval(t: TaskConfig, seed: int) -> Task:
    held_out = min(t.test_size, HUMANEVAL_SIZE)
    # HumanEval's own code-block template unless task.prompt_template is set (the class holds its default).
    template = t.prompt_template if t.prompt_template != type(t).prompt_template else HUMANEVAL_TEMPLATE
    return humaneval_task(train_size=HUMANEVAL_SIZE - held_out, prompt_template=template)


def benchmark(name: str, t: TaskConfig, seed: int) -> Task:
    has_train = BENCHMARKS[name].has_train
    return benchmark_task(name, data_dir=t.data_dir or None, hub=t.hub, prompt_template=t.prompt_template,
                          train_size=t.train_size if has_train else 0, test_size=t.test_size or None)


def environment(t: TaskConfig, seed: int) -> Task:
    if not t.environment_levels:
        return environment_task(environment_from_spec(t.environment, t.environment_config), train_size=t.train_size,
                                test_size=t.test_size, seed=seed, prompt_template=t.prompt_template)
    levels = json.loads(t.environment_levels)
    if not isinstance(levels, list) or not all(isinstance(level, dict) for level in levels):
        raise ValueError(f"task.environment_levels must be a JSON list of objects, got {t.environment_levels!r}")
    return leveled_environment_task(t.environment, levels, train_size=t.train_size, test_size=t.test_size,
                                    seed=seed, prompt_template=t.prompt_template)


def jsonl(t: TaskConfig, seed: int) -> Task:
    return Task.from_records(t.train_path, t.test_path or None, prompt_field=t.prompt_field,
                             answer_field=t.answer_field, prompt_template=t.prompt_template,
                             test_size=t.test_size, name=Path(t.train_path).stem,
                             difficulty_field=t.difficulty_field or None, tag_source=True)


def verifiers(t: TaskConfig, seed: int) -> Task:
    return verifiers_task(env=t.env, env_args=t.env_args, train_size=t.train_size, test_size=t.test_size)


def openenv(t: TaskConfig, seed: int) -> Task:
    """An OpenEnv environment's problems are its episodes: one reset seed each (train and held-out
    seeds drawn from separate streams of the run's seed); the first observation is the prompt."""
    def episodes(split: str, count: int) -> list[Problem]:
        seeds = [derive_seed31(seed, "openenv", split, index) for index in range(count)]
        return [Problem(id=f"{split}-{index}", prompt=f"episode with seed {s}", answer="", metadata={"seed": s})
                for index, s in enumerate(seeds)]

    return Task(name="openenv", train=episodes("train", t.train_size), test=episodes("test", t.test_size))


TASKS: dict[str, Callable[[TaskConfig, int], Task]] = {
    "arithmetic": arithmetic, **{name: partial(benchmark, name) for name in BENCHMARKS}, "humaneval": humaneval,
    "environment": environment, "jsonl": jsonl, "verifiers": verifiers, "openenv": openenv}
