"""A training run under another allocator (what `make train` preloads where one is installed) samples the
same completions and ends at the same parameters as under glibc's malloc: the allocator changes where
tensors live, not a number."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import INSTALLED_ALLOCATOR, environment_preloading, parameters

from reasonrl import allocator

TRAIN = """
import sys
sys.path.insert(0, sys.argv[3])
from helpers import TASK, share_of_a, tiny_config
from reasonrl import train
from reasonrl.allocator import preloaded_allocator
from pathlib import Path
train(tiny_config(Path(sys.argv[1]), Path(sys.argv[2]), "train.steps=2", "run.save_every=2", "run.device=cpu"),
      task=TASK, reward=share_of_a)
print(preloaded_allocator())
"""


def train_in_a_process(model_dir: Path, run_dir: Path, preload: str | None) -> str:
    out = subprocess.run([sys.executable, "-c", TRAIN, str(model_dir), str(run_dir), str(Path(__file__).parents[1])],
                         env=environment_preloading(preload), check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(INSTALLED_ALLOCATOR is None or not sys.platform.startswith("linux"),
                    reason="neither tcmalloc nor mimalloc is installed")
def test_a_run_under_another_allocator_is_the_same_run(tiny_model_dir, tmp_path):
    assert train_in_a_process(tiny_model_dir, tmp_path / "glibc", None) == "None"
    library = allocator.library_to_preload(INSTALLED_ALLOCATOR)
    preloaded = train_in_a_process(tiny_model_dir, tmp_path / "other", library)
    assert preloaded.startswith(f"lib{allocator.ALLOCATORS[INSTALLED_ALLOCATOR]}.so")
    ours, theirs = ((tmp_path / arm / "rollouts.jsonl").read_text().splitlines() for arm in ("glibc", "other"))
    assert len(ours) == 2 * 4 * 8 and [json.loads(r)["completion"] for r in ours] == \
        [json.loads(r)["completion"] for r in theirs]
    first, second = (parameters(tmp_path / arm / "checkpoints" / "step_000002" / "policy") for arm in ("glibc", "other"))
    assert any(not torch.equal(first[name], parameters(tiny_model_dir)[name]) for name in first)  # it trained
    for name in first:
        assert torch.equal(first[name], second[name]), name
