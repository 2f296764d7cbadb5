"""Tasks: the problems to train and evaluate on, with their gold answers: built-in generators and
benchmarks, loaders for your files and hub datasets, procedural environments (reasoning-gym), and a
contamination check. `TASKS` (reasonrl.tasks.builtin) builds each task task.name can name."""

from reasonrl.tasks.arithmetic import arithmetic_task
from reasonrl.tasks.base import DatasetError, Task, load_hf, problems_from_records, read_jsonl, read_records
from reasonrl.tasks.benchmarks import BENCHMARKS, benchmark_task
from reasonrl.tasks.builtin import TASKS
from reasonrl.tasks.decontamination import decontaminate, ngram_overlap
from reasonrl.tasks.environments import (
    EnvironmentReward,
    MixtureEnvironment,
    ProblemGenerator,
    ReasoningGymEnvironment,
    environment_from_spec,
    environment_task,
)
from reasonrl.tasks.humaneval import HUMANEVAL_SIZE, HUMANEVAL_TEMPLATE, humaneval_task

__all__ = [
    "BENCHMARKS",
    "HUMANEVAL_SIZE",
    "HUMANEVAL_TEMPLATE",
    "TASKS",
    "DatasetError",
    "EnvironmentReward",
    "MixtureEnvironment",
    "ProblemGenerator",
    "ReasoningGymEnvironment",
    "Task",
    "arithmetic_task",
    "benchmark_task",
    "decontaminate",
    "environment_from_spec",
    "environment_task",
    "humaneval_task",
    "load_hf",
    "ngram_overlap",
    "problems_from_records",
    "read_jsonl",
    "read_records",
]
