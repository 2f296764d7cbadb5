"""reasonrl: reinforcement learning of language models on tasks with verifiable rewards."""

from reasonrl.config import Config, ConfigError, load_config
from reasonrl.tasks import Task
from reasonrl.trainer import TrainResult, train
from reasonrl.types import Completion, Group, Problem, SamplingParams, TrainBatch

__all__ = ["Completion", "Config", "ConfigError", "Group", "Problem", "SamplingParams", "Task", "TrainBatch",
           "TrainResult", "load_config", "train"]
