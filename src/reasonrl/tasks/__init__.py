"""Tasks: the problems to train and evaluate on, with their gold answers."""

from reasonrl.tasks.arithmetic import arithmetic_task
from reasonrl.tasks.base import Task, problems_from_records, read_jsonl

__all__ = ["Task", "arithmetic_task", "problems_from_records", "read_jsonl"]
