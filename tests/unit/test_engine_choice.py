"""rollout.engine: the config refuses what an engine cannot be combined with, an engine's knobs set
for another engine, and training with the served (openai) engine, before any model is loaded."""

from __future__ import annotations

import pytest
import torch

from reasonrl.build import build_models
from reasonrl.config import ConfigError, load_config
from reasonrl.rollout.choice import build_engine


@pytest.mark.parametrize(("overrides", "fix"), [
    (["rollout.engine=vllm", "run.backend=ray"], "run.backend=local"),
    (["rollout.engine=vllm", "run.device=cpu"], "run.device=auto or cuda"),
    (["rollout.engine=vllm", "train.lora_rank=8"], "train.lora_rank=0"),
    (["rollout.engine=vllm", "rollout.top_k=20"], "rollout.top_k=0 and rollout.top_p=1"),
    (["rollout.engine=vllm", "rollout.top_p=0.9"], "rollout.top_k=0 and rollout.top_p=1"),
    (["rollout.engine=openai"], "rollout.openai_url=http://HOST:PORT/v1"),
    (["rollout.engine=openai", "rollout.openai_url=http://127.0.0.1:1/v1", "agent.environment=python_math"],
     "agent.environment=''"),
])
def test_what_an_engine_cannot_be_combined_with_is_refused(overrides, fix):
    with pytest.raises(ConfigError, match="rollout.engine") as refused:
        load_config(overrides=overrides)
    assert fix in str(refused.value)


@pytest.mark.parametrize("overrides", [
    ["rollout.engine=vllm", "rollout.vllm_gpu_memory_utilization=0.7", "rollout.vllm_max_model_len=2048"],
    ["rollout.engine=openai", "rollout.openai_url=http://127.0.0.1:1/v1"],
    ["rollout.engine=vllm", "run.device=cuda", "rollout.top_k=0", "rollout.top_p=1.0"],
])
def test_an_engine_with_its_own_knobs_is_accepted(overrides):
    cfg = load_config(overrides=overrides)
    assert cfg.rollout.engine == overrides[0].partition("=")[2]


@pytest.mark.parametrize(("overrides", "unused"), [
    (["rollout.vllm_max_model_len=1024"], "rollout.vllm_max_model_len"),
    (["rollout.vllm_gpu_memory_utilization=0.8"], "rollout.vllm_gpu_memory_utilization"),
    (["rollout.engine=vllm", "rollout.openai_url=http://127.0.0.1:1/v1"], "rollout.openai_url"),
])
def test_a_knob_of_another_engine_is_refused_as_unused(overrides, unused):
    with pytest.raises(ConfigError, match=unused):
        load_config(overrides=overrides)


def test_training_refuses_the_served_engine_before_loading_anything(tmp_path):
    cfg = load_config(overrides=[f"model.name={tmp_path / 'no-such-model'}", "rollout.engine=openai",
                                 "rollout.openai_url=http://127.0.0.1:1/v1"])
    # The model does not exist: a refusal that came after loading it would be a ModelNotFoundError.
    with pytest.raises(ValueError, match="rollout.engine=openai samples a served model that training cannot update"):
        build_models(cfg, torch.device("cpu"), None)


def test_the_hf_engine_samples_from_its_own_copy_in_the_rollout_dtype(tiny_model_dir):
    from reasonrl.models import load_model, load_tokenizer
    from reasonrl.rollout.hf import HFEngine

    policy = load_model(str(tiny_model_dir), dtype=torch.float32, device=torch.device("cpu"))
    cfg = load_config(overrides=[f"model.name={tiny_model_dir}", "rollout.dtype=bfloat16", "rollout.fused=false",
                                 "model.chat_template=false"])
    engine = build_engine(cfg, policy, load_tokenizer(str(tiny_model_dir)), torch.device("cpu"))
    assert isinstance(engine, HFEngine)
    assert engine.model is not policy and next(engine.model.parameters()).dtype == torch.bfloat16
    assert next(policy.parameters()).dtype == torch.float32
    assert engine.fused is None and engine.chat_template is False


def test_the_hf_engines_copy_is_the_model_from_pretrained_gives_in_that_dtype(tiny_model_dir):
    """Its weights in bfloat16, RoPE's inverse frequencies kept in float32: the engine a run samples
    from computes what `reasonrl eval` on a checkpoint of the same weights does."""
    from reasonrl.models import load_model, load_tokenizer

    cpu = torch.device("cpu")
    policy = load_model(str(tiny_model_dir), dtype=torch.float32, device=cpu)
    cfg = load_config(overrides=[f"model.name={tiny_model_dir}", "rollout.dtype=bfloat16"])
    engine = build_engine(cfg, policy, load_tokenizer(str(tiny_model_dir)), cpu)
    loaded = load_model(str(tiny_model_dir), dtype=torch.bfloat16, device=cpu)
    copied = dict(engine.model.named_buffers())
    assert "model.rotary_emb.inv_freq" in copied
    for name, buffer in loaded.named_buffers():
        assert copied[name].dtype == buffer.dtype and torch.equal(copied[name], buffer), name
    assert copied["model.rotary_emb.inv_freq"].dtype == torch.float32
    assert "model.rotary_emb.inv_freq" not in engine.model.state_dict()  # still not saved with the weights
    positions = torch.arange(512)[None]
    ids = torch.randint(5, 50, (1, 512), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(engine.model(ids, position_ids=positions).logits, loaded(ids, position_ids=positions).logits)
