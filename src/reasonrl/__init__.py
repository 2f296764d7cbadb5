"""reasonrl: reinforcement learning of language models on tasks with verifiable rewards.

The public names below are imported on first use (PEP 562), so that `import reasonrl.<module>`
and the command line do not pay for torch, transformers and the training loop when they need
only a part of the package (a sandbox worker, `reasonrl recipes`, `reasonrl --help`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reasonrl.config import Config, ConfigError, load_config
    from reasonrl.tasks import Task
    from reasonrl.trainer import TrainResult, train
    from reasonrl.types import Completion, Group, Participant, Problem, SamplingParams, TrainBatch

_HOMES = {
    "Config": "reasonrl.config", "ConfigError": "reasonrl.config", "load_config": "reasonrl.config",
    "Task": "reasonrl.tasks", "TrainResult": "reasonrl.trainer", "train": "reasonrl.trainer",
    "Completion": "reasonrl.types", "Group": "reasonrl.types", "Participant": "reasonrl.types",
    "Problem": "reasonrl.types", "SamplingParams": "reasonrl.types", "TrainBatch": "reasonrl.types",
}
__all__ = ["Completion", "Config", "ConfigError", "Group", "Participant", "Problem", "SamplingParams", "Task",
           "TrainBatch", "TrainResult", "load_config", "train"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'reasonrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once imported, a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
