"""Activation checkpointing modes (reasonrl.training.recompute): every mode gives the update's
gradients unchanged, selective recomputes no matrix product in backward while full recomputes
them all, and auto checkpoints only inputs longer than its threshold."""

from __future__ import annotations

import pytest
import torch
from helpers import TINY_LLAMA_LAYERS as LAYERS
from helpers import batch, tiny_llama
from torch.utils._python_dispatch import TorchDispatchMode

from reasonrl.algo.aggregation import token_mean
from reasonrl.algo.objectives import ppo_clip
from reasonrl.training import recompute
from reasonrl.training.learner import Learner, OptimConfig, PolicyLoss


def is_checkpointing(model) -> bool:
    """transformers' flag, by its name in the installed release (is_gradient_checkpointing in releases such as 5.17)."""
    flag = getattr(type(model), "is_activation_checkpointing", None)
    return model.is_activation_checkpointing if flag is not None else model.is_gradient_checkpointing


def gradients(mode: str, pack: bool, positions: int = 0, autocast: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    model = tiny_llama(mode, positions)
    learner = Learner(model, OptimConfig(lr=0.0, grad_clip=0.0), pack=pack, autocast_dtype=autocast)
    learner.update(batch(), PolicyLoss(objective=ppo_clip, aggregation=token_mean, entropy_coef=0.01),
                   micro_batch_size=4)
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
@pytest.mark.parametrize("pack", [True, False])
def test_every_mode_gives_the_gradients_of_keeping_everything(pack, autocast):
    kept = gradients("off", pack, autocast=autocast)
    assert sum(g.abs().sum() for g in kept.values()) > 0
    # auto with a threshold of 8 positions checkpoints the whole micro-batch (5 + 24 tokens).
    for mode, positions in (("selective", 0), ("full", 0), ("auto", 8), ("auto", 10_000)):
        recomputed = gradients(mode, pack, positions, autocast)
        for name in kept:
            torch.testing.assert_close(recomputed[name], kept[name], atol=1e-6, rtol=1e-5, msg=f"{mode} {name}")


MATMUL_OPS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
                        torch.ops.aten.baddbmm.default})


class MatmulCounter(TorchDispatchMode):

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in MATMUL_OPS
        return func(*args, **(kwargs or {}))


def backward_matmuls(mode: str) -> int:
    model = tiny_llama(mode).train()
    input_ids = batch().input_ids_NT
    loss = model(input_ids=input_ids).logits.float().logsumexp(-1).mean()
    with MatmulCounter() as counter:
        loss.backward()
    return counter.count


def test_selective_recomputes_no_matmul_and_full_recomputes_them_all():
    kept = backward_matmuls("off")
    # Per layer 7 projections, each with a matmul for its input's and one for its weight's gradient.
    assert kept >= LAYERS * 7 * 2
    assert backward_matmuls("selective") == kept
    # Full replays each layer's forward up to the last tensor its backward needs: 6 of the 7
    # projections (the down projection's output is needed by nothing).
    assert backward_matmuls("full") == kept + LAYERS * 6


def checkpoint_calls(monkeypatch, model_positions: int, tokens: int) -> list[dict]:
    """The keyword arguments of each call of torch's checkpoint in a forward of `tokens` tokens
    through a tiny Llama set to auto with `model_positions`."""
    calls = []
    real = recompute.checkpoint
    monkeypatch.setattr(recompute, "checkpoint", lambda *a, **k: calls.append(k) or real(*a, **k))
    model = tiny_llama("auto", positions=model_positions).train()
    model(input_ids=torch.arange(2, 2 + tokens)[None]).logits.sum().backward()
    return calls


@pytest.mark.parametrize("tokens, checkpointed", [(8, False), (9, True)])
def test_auto_on_a_cpu_checkpoints_selectively_only_inputs_longer_than_its_threshold(monkeypatch, tokens,
                                                                                     checkpointed):
    calls = checkpoint_calls(monkeypatch, 8, tokens)
    assert len(calls) == (LAYERS if checkpointed else 0)
    assert all("context_fn" in call for call in calls)  # selective


def test_the_positions_that_fit_in_memory_by_hand():
    model = tiny_llama("off")  # hidden 16, 3 layers: 54 x 16 x 3 = 2592 bytes kept per position
    assert recompute.positions_fitting_in_memory(model, free_bytes=2592 * 20) == 10  # half of 20
    assert recompute.positions_fitting_in_memory(model, free_bytes=2592 * 20 - 1) == 9


@pytest.mark.parametrize("tokens, checkpointed", [(10, False), (11, True)])
def test_auto_on_a_gpu_checkpoints_fully_only_what_would_not_fit_in_half_its_free_memory(monkeypatch, tokens,
                                                                                         checkpointed):
    monkeypatch.setattr(recompute, "device_of", lambda model: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (2592 * 20, 2592 * 100))
    calls = checkpoint_calls(monkeypatch, 8, tokens)  # micro_batch_positions does not matter there
    assert len(calls) == (LAYERS if checkpointed else 0)
    assert not any("context_fn" in call for call in calls)  # full


def test_auto_leaves_a_model_without_checkpointing_support_alone_and_other_modes_refuse_it():
    model = tiny_llama("off")
    model.supports_gradient_checkpointing = False
    recompute.enable(model, "auto", 8)
    assert not is_checkpointing(model)
    with pytest.raises(ValueError, match="does not support"):
        recompute.enable(model, "selective")
    with pytest.raises(ValueError, match="modes: auto, off, selective, full"):
        recompute.enable(model, "sometimes")


def test_transformers_releases_without_activation_checkpointing_enable_are_switched_by_the_older_name(monkeypatch):
    # transformers 5.17 names the switch gradient_checkpointing_enable only; every mode must still
    # checkpoint there, with the same gradients.
    from transformers import PreTrainedModel

    kept = gradients("off", pack=True)
    if hasattr(PreTrainedModel, "activation_checkpointing_enable"):  # a release with both: remove the new name
        switch = PreTrainedModel.activation_checkpointing_enable
        monkeypatch.setattr(PreTrainedModel, "gradient_checkpointing_enable", lambda self, kwargs=None: switch(self, kwargs))
        monkeypatch.delattr(PreTrainedModel, "activation_checkpointing_enable")
    for mode, positions in (("selective", 0), ("full", 0), ("auto", 8)):
        model = tiny_llama(mode, positions)
        assert is_checkpointing(model), mode
        recomputed = gradients(mode, pack=True, positions=positions)
        for name in kept:
            torch.testing.assert_close(recomputed[name], kept[name], atol=1e-6, rtol=1e-5, msg=f"{mode} {name}")
