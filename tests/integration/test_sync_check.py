"""The weight-sync check on a tiny model: a correct sync passes (hf, fused decoder, LoRA,
asynchronous) and logs sync/logp_gap and sync/changed; a deliberately broken one stops the run
at the first step with a message naming the backend and the cause: a no-op load_weights, a fused
decoder left with its packed copy of the old weights, an adapter sync that skips a module.
(Rollout workers that keep their old weights: tests/integration/test_ray.py.)"""

from __future__ import annotations

import json

import pytest
from helpers import TASK, share_of_a, tiny_config

from reasonrl import train
from reasonrl.guards.sync_check import SyncCheckError
from reasonrl.models import copy_weights
from reasonrl.rollout.hf import HFEngine

LORA = ("train.lora_rank=8", "train.lora_alpha=16")


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory):
    """Larger initial weights: LoRA's updates show in the log-probs at once (see test_train's LoRA test)."""
    from helpers import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("wide-model"), initializer_range=0.3)


@pytest.mark.parametrize("knobs", [("rollout.fused=false",), ("rollout.fused=true",), LORA,
                                   ("rollout.max_staleness=1",)], ids=["hf", "fused", "lora", "async"])
def test_a_correct_sync_passes_and_is_logged(wide_model_dir, tmp_path, knobs):
    train(tiny_config(wide_model_dir, tmp_path, "train.steps=2", *knobs), task=TASK, reward=share_of_a)
    logged = [m for m in metrics(tmp_path) if "sync/logp_gap" in m]
    assert len(logged) == 2
    assert all(m["sync/logp_gap"] < 1e-3 for m in logged), logged
    assert all(m["sync/changed"] == 1.0 for m in logged), logged  # lr 1e-2 moves every probe sequence


def no_op_load(self, named_tensors):
    list(named_tensors)


def copy_without_rebuilding_the_decoder(self, named_tensors):
    copy_weights(self.model, named_tensors)


@pytest.mark.parametrize("knobs,broken,backend,cause", [
    (("rollout.fused=false",), no_op_load, "local hf engine, float32",
     ("did not reach the engine, and rollouts keep coming from the old policy. Likely cause: "
      "the engine's load_weights copied nothing")),
    (LORA, no_op_load, "LoRA adapters", "old policy. Likely cause: the adapters were not copied"),
    # The decoder shares the embeddings and norms with the model, so its output moves a little: the gap shows it.
    (("rollout.fused=true",), copy_without_rebuilding_the_decoder, "fused decoder",
     ("another policy than the one trained. Likely cause: part of the weights was not synced (a module or adapter "
      "skipped), e.g. the fused decoder kept its packed copy")),
], ids=["hf", "lora", "fused"])
def test_a_broken_sync_stops_the_first_step(wide_model_dir, tmp_path, monkeypatch, knobs, broken, backend, cause):
    monkeypatch.setattr(HFEngine, "load_weights", broken)
    with pytest.raises(SyncCheckError, match="after step 1[ ']") as error:
        train(tiny_config(wide_model_dir, tmp_path, "train.steps=2", *knobs), task=TASK, reward=share_of_a)
    assert f"(backend: {backend}" in str(error.value) or f", {backend}" in str(error.value), str(error.value)
    assert cause in str(error.value), str(error.value)


def test_an_adapter_sync_that_skips_a_module_stops_the_first_step(wide_model_dir, tmp_path, monkeypatch):
    load = HFEngine.load_weights

    def skip_value_adapters(self, named_tensors):
        load(self, ((name, tensor) for name, tensor in named_tensors if "v_proj" not in name))

    monkeypatch.setattr(HFEngine, "load_weights", skip_value_adapters)
    with pytest.raises(SyncCheckError, match=r"after step 1's sync .*LoRA adapters.*skipped some adapter modules"):
        train(tiny_config(wide_model_dir, tmp_path, "train.steps=2", *LORA), task=TASK, reward=share_of_a)


def test_the_check_can_be_turned_off(wide_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(HFEngine, "load_weights", no_op_load)
    train(tiny_config(wide_model_dir, tmp_path, "train.steps=2", "run.sync_check=false"), task=TASK,
          reward=share_of_a)
    assert not any("sync/logp_gap" in m for m in metrics(tmp_path))
