"""Tasks: the problems to train and evaluate on, with their gold answers."""

from reasonrl.tasks.arithmetic import arithmetic_task
from reasonrl.tasks.base import Task, problems_from_records, read_jsonl
from reasonrl.tasks.humaneval import HUMANEVAL_SIZE, HUMANEVAL_TEMPLATE, humaneval_task

__all__ = ["HUMANEVAL_SIZE", "HUMANEVAL_TEMPLATE", "Task", "arithmetic_task", "humaneval_task", "problems_from_records",
           "read_jsonl"]
