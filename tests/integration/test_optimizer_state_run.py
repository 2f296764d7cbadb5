"""A run with train.optimizer_state=8bit: its checkpoints hold 8-bit moments and resume exactly."""

from __future__ import annotations

import pytest
import torch
from helpers import TASK, build_tiny_model, parameters, share_of_a, tiny_config, train_straight_and_resumed

from reasonrl import train
from reasonrl.training.checkpoint import load_trainer_state

pytest.importorskip("bitsandbytes")


def tensors_in(state) -> list[torch.Tensor]:
    """The tensors of a state dict, however nested (bitsandbytes keeps its moments in a dict of their own)."""
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [tensor for value in state.values() for tensor in tensors_in(value)]
    return []


def test_a_run_with_8bit_state_resumes_exactly_and_only_with_it(tmp_path):
    # Hidden size 64: the embedding (106 x 64) and the MLP's matrices (64 x 128) pass the 4096 values
    # from which moments are kept in 8 bits.
    model_dir = build_tiny_model(tmp_path / "model", hidden=64)
    train_straight_and_resumed(model_dir, tmp_path, "train.optimizer_state=8bit")
    straight = parameters(tmp_path / "straight" / "checkpoints" / "step_000004" / "policy")
    resumed = parameters(tmp_path / "resumed" / "checkpoints" / "step_000004" / "policy")
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    assert any(not torch.equal(straight[name], value) for name, value in parameters(model_dir).items())  # it trained
    learner = load_trainer_state(tmp_path / "straight" / "checkpoints" / "step_000004")["learner"]
    assert learner["optimizer_state"] == "8bit"
    assert any(value.dtype == torch.uint8 for value in tensors_in(learner["optimizer"]["state"]))
    with pytest.raises(Exception, match="train.optimizer_state"):
        train(tiny_config(model_dir, tmp_path / "resumed", "train.steps=6", "run.resume=true"), task=TASK,
              reward=share_of_a)
