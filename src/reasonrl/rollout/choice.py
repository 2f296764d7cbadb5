"""The rollout engine a config names (rollout.engine), built in one place: a name -> builder table.

- hf: transformers in this process, on its own copy of the policy (rollout.dtype, fused, cuda_graphs);
- vllm: vLLM on the GPU (rollout.vllm_*), which loads model.name from disk and is then handed the
  policy's weights, so that a resumed run samples what it trained; the trainer syncs it after each
  update through its `load_weights`;
- openai: a model served behind an OpenAI-compatible API at rollout.openai_url. It returns text
  only (neither the sampled token ids nor their log-probs) and its weights cannot follow the
  learner, so it samples a frozen model for evaluation; the training builders refuse it.

Each builder takes the trainable policy (float32, possibly LoRA-wrapped), its tokenizer and the
device it lives on, and declares (reasonrl.spec) the config keys it reads: a vllm_* or openai_*
knob set for another engine is refused as unused. The Ray backend and agent environments replace
or wrap what is built here (reasonrl.build).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from reasonrl.models import inference_copy, resolve_dtype, resolve_model_path
from reasonrl.rollout.hf import HFEngine
from reasonrl.rollout.openai import OpenAIEngine
from reasonrl.rollout.vllm import VLLMEngine
from reasonrl.spec import arguments, declare

if TYPE_CHECKING:
    from reasonrl.config import Config

EngineBuilder = Callable[..., Any]
"""(policy, tokenizer, device, **its declared knobs and context) -> a rollout engine."""


@declare(knobs={"max_rows": "rollout.max_batch_rows"},
         context={"dtype": "rollout.dtype", "chat_template": "model.chat_template", "fused": "rollout.fused",
                  "cuda_graphs": "rollout.cuda_graphs"})
def hf_engine(policy: Any, tokenizer: Any, device: torch.device, *, dtype: str, chat_template: bool, fused: bool,
              cuda_graphs: bool, max_rows: int) -> HFEngine:
    """transformers on a copy of the policy, its weights in `dtype`, decoding at most `max_rows` rows at
    once (0: all of a call's)."""
    return HFEngine(inference_copy(policy, resolve_dtype(dtype, device)), tokenizer, chat_template=chat_template,
                    fused=fused, cuda_graphs=cuda_graphs, max_rows=max_rows)


@declare(knobs={"gpu_memory_utilization": "rollout.vllm_gpu_memory_utilization",
                "max_model_len": "rollout.vllm_max_model_len"},
         context={"model": "model.name", "dtype": "rollout.dtype", "chat_template": "model.chat_template",
                  "cuda_graphs": "rollout.cuda_graphs", "seed": "run.seed"})
def vllm_engine(policy: Any, tokenizer: Any, device: torch.device, *, model: str, dtype: str, chat_template: bool,
                cuda_graphs: bool, seed: int, gpu_memory_utilization: float, max_model_len: int) -> VLLMEngine:
    """vLLM colocated with the learner (in this process), holding the policy's current weights;
    `max_model_len` 0 is the model's own context length, `cuda_graphs` false runs vLLM eagerly."""
    engine = VLLMEngine(resolve_model_path(model), tokenizer, chat_template=chat_template,
                        dtype=str(resolve_dtype(dtype, device)).removeprefix("torch."),
                        gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len or None,
                        seed=seed, enforce_eager=not cuda_graphs)
    engine.load_weights((name, p.detach()) for name, p in policy.named_parameters())
    return engine


@declare(knobs={"url": "rollout.openai_url"}, context={"model": "model.name"})
def openai_engine(policy: Any, tokenizer: Any, device: torch.device, *, url: str, model: str) -> OpenAIEngine:
    """The model `model` as served at `url` (the policy is not used)."""
    if not url:
        raise ValueError("rollout.engine=openai needs rollout.openai_url=http://HOST:PORT/v1, the server's API root")
    return OpenAIEngine(url, model)


ENGINES: dict[str, EngineBuilder] = {"hf": hf_engine, "vllm": vllm_engine, "openai": openai_engine}


def build_engine(cfg: Config, policy: Any, tokenizer: Any, device: torch.device) -> Any:
    """The rollout engine cfg.rollout.engine names, sampling from `policy`'s weights."""
    try:
        builder = ENGINES[cfg.rollout.engine]
    except KeyError:
        raise ValueError(f"rollout.engine={cfg.rollout.engine!r} is not an engine; engines: "
                         f"{', '.join(ENGINES)}") from None
    return builder(policy, tokenizer, device, **arguments(builder, cfg.value))
