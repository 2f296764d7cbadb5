"""Shared fixtures: a tiny random Llama with a character-level tokenizer, built offline (by
helpers.build_tiny_model); and how the suite shares the machine when pytest-xdist runs it in
several processes (`make test`). Plain helper functions and constants live in helpers.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from helpers import build_tiny_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Under pytest-xdist each worker process takes its share of the cores, so that N workers do not
# run N times as many compute threads as there are cores.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))
# A fixed count for every run a test starts (run.threads=0 would otherwise re-divide the cores as
# the other worker's runs come and go, and runs compared bit for bit could reduce in other orders).
os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))

# Under pytest-xdist (`make test`), the Ray modules share one worker: each starts a local Ray
# instance sized to the machine (`--dist loadgroup` keeps a group on one worker). The sandbox
# modules check that no sandbox process or directory outlives a test anywhere on the machine, which
# a sandboxed program of a test in another worker would break: they are marked `serial`, and
# `make test` runs them after the others, alone.
_RAY_MODULES = ("test_ray.py", "test_scale_train.py", "test_ray_init.py")
_SERIAL_MODULES = ("test_sandbox.py", "test_sandbox_attacks.py", "test_code_reward.py")


@pytest.hookimpl(tryfirst=True)  # before -m selects by these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in _RAY_MODULES:
            item.add_marker(pytest.mark.xdist_group("ray"))
        elif item.path.name in _SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def talking_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model whose greedy replies have text.

    The shared tiny model's greedy replies are special tokens only (empty text); with larger initial
    weights, comparing two engines' replies compares something.
    """
    return build_tiny_model(tmp_path_factory.mktemp("talking-model"), initializer_range=0.5)
