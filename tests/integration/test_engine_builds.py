"""rollout.engine builds the engine it names, checked on CPU:

- vllm, against a stand-in `vllm` package (vLLM itself needs CUDA) whose LLM samples with the hf
  engine on the model it is given and records what it is asked: how the engine is constructed
  from the config, which weights each sync loads, and each request's sampling parameters. A
  training run on it passes the weight-sync check, which fails when a sync does not reach the
  model that samples;
- openai, against `reasonrl serve` on loopback: the engine built from the config samples the
  served model, and `reasonrl eval --config` samples through it."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from reasonrl import Problem, Task, load_config, train
from reasonrl.models import copy_weights, load_model, load_tokenizer
from reasonrl.rollout.choice import build_engine
from reasonrl.rollout.hf import HFEngine
from reasonrl.rollout.openai import OpenAIEngine
from reasonrl.seeds import problem_seed
from reasonrl.serve import Server
from reasonrl.types import SamplingParams

CPU = torch.device("cpu")
PROBLEMS = [Problem(id=str(i), prompt=f"question {i}", answer="") for i in range(3)]


@dataclass
class VLLMCalls:
    """What the stand-in vLLM was asked: LLM(...) keyword arguments, each generate call's per-request
    sampling parameters, each weight load's (name, shape) pairs, prefix-cache resets."""

    constructed: list[dict[str, Any]] = field(default_factory=list)
    requests: list[list[dict[str, Any]]] = field(default_factory=list)
    loads: list[list[tuple[str, tuple[int, ...]]]] = field(default_factory=list)
    cache_resets: int = 0


def stand_in_vllm(calls: VLLMCalls) -> types.ModuleType:
    """A `vllm` module with the parts VLLMEngine uses, sampling with the hf engine (fused decoder off)."""

    class VLLMSamplingParams:
        def __init__(self, **kwargs: Any):
            self.kwargs = kwargs

    class Model:
        def __init__(self, engine: HFEngine):
            self.engine = engine

        def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
            calls.loads.append([(name, tuple(tensor.shape)) for name, tensor in weights])
            copy_weights(self.engine.model, weights)

    class LLM:
        def __init__(self, **kwargs: Any):
            calls.constructed.append(kwargs)
            model = AutoModelForCausalLM.from_pretrained(kwargs["model"], dtype=getattr(torch, kwargs["dtype"]))
            self.engine = HFEngine(model, AutoTokenizer.from_pretrained(kwargs["tokenizer"]), fused=False)
            worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=Model(self.engine)))
            self.llm_engine = types.SimpleNamespace(
                model_executor=types.SimpleNamespace(driver_worker=types.SimpleNamespace(worker=worker)))

        def generate(self, prompts: list[dict[str, list[int]]], params: list[VLLMSamplingParams],
                     use_tqdm: bool = True) -> list[Any]:
            calls.requests.append([p.kwargs for p in params])
            return [self._output(prompt["prompt_token_ids"], p.kwargs) for prompt, p in zip(prompts, params)]

        def _output(self, prompt_ids: list[int], asked: dict[str, Any]) -> Any:
            sampling = SamplingParams(n=asked["n"], temperature=asked["temperature"], max_new_tokens=asked["max_tokens"],
                                      stop=tuple(asked["stop"]), ignore_eos=asked["ignore_eos"])
            [completions] = self.engine.continue_from([prompt_ids], sampling, seeds=[asked["seed"] or 0])
            return types.SimpleNamespace(outputs=[types.SimpleNamespace(
                token_ids=list(c.token_ids), text=c.text, finish_reason=c.finish_reason,
                logprobs=[{token: types.SimpleNamespace(logprob=lp)} for token, lp in zip(c.token_ids, c.logprobs)])
                for c in completions])

        def reset_prefix_cache(self) -> None:
            calls.cache_resets += 1

    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams = LLM, VLLMSamplingParams
    return module


@pytest.fixture
def vllm_calls(monkeypatch) -> VLLMCalls:
    import reasonrl.rollout.vllm as engine_module

    calls = VLLMCalls()
    monkeypatch.setitem(sys.modules, "vllm", stand_in_vllm(calls))
    monkeypatch.setattr(engine_module, "require_cuda", lambda: None)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "")  # restored after the test, whatever the engine sets
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")
    return calls


def vllm_config(model_dir: Path, *extra: str) -> Any:
    return load_config(overrides=[f"model.name={model_dir}", "rollout.engine=vllm", "rollout.dtype=float32", *extra])


def test_vllm_engine_is_built_from_the_config_and_handed_the_policy(vllm_calls, tiny_model_dir):
    policy = load_model(str(tiny_model_dir), dtype=torch.float32, device=CPU)
    with torch.no_grad():  # the policy has moved away from the model on disk, as a resumed one has
        policy.model.norm.weight.add_(0.5)
    cfg = vllm_config(tiny_model_dir, "run.seed=5", "rollout.vllm_gpu_memory_utilization=0.3",
                      "rollout.vllm_max_model_len=128", "rollout.cuda_graphs=false")
    engine = build_engine(cfg, policy, load_tokenizer(str(tiny_model_dir)), CPU)

    [constructed] = vllm_calls.constructed
    assert constructed == {"model": str(tiny_model_dir), "tokenizer": str(tiny_model_dir), "dtype": "float32",
                           "seed": 5, "gpu_memory_utilization": 0.3, "max_model_len": 128, "enable_sleep_mode": True,
                           "logprobs_mode": "processed_logprobs", "enforce_eager": True}
    assert vllm_calls.loads == [[(name, tuple(p.shape)) for name, p in policy.named_parameters()]]
    assert vllm_calls.cache_resets == 1
    assert torch.equal(engine.llm.engine.model.model.norm.weight, policy.model.norm.weight)


def test_vllm_engine_defaults_leave_the_context_and_cuda_graphs_to_vllm(vllm_calls, tiny_model_dir):
    policy = load_model(str(tiny_model_dir), dtype=torch.float32, device=CPU)
    build_engine(vllm_config(tiny_model_dir), policy, load_tokenizer(str(tiny_model_dir)), CPU)
    [constructed] = vllm_calls.constructed
    assert (constructed["max_model_len"], constructed["enforce_eager"], constructed["gpu_memory_utilization"]) == \
        (None, False, 0.4)


def test_vllm_requests_carry_the_sampling_settings_and_a_seed_per_problem(vllm_calls, tiny_model_dir):
    policy = load_model(str(tiny_model_dir), dtype=torch.float32, device=CPU)
    engine = build_engine(vllm_config(tiny_model_dir), policy, load_tokenizer(str(tiny_model_dir)), CPU)
    groups = engine.generate(PROBLEMS, SamplingParams(n=3, temperature=0.8, max_new_tokens=5, stop=("9",), seed=11))
    [requests] = vllm_calls.requests
    # Untruncated sampling (no top_k/top_p: vLLM's defaults), the sampled token's log-prob only.
    assert requests == [{"n": 3, "temperature": 0.8, "max_tokens": 5, "stop": ["9"], "seed": problem_seed(11, i),
                         "logprobs": 0, "skip_special_tokens": True, "ignore_eos": False} for i in range(3)]
    assert [g.size for g in groups] == [3, 3, 3]
    assert all(len(c.logprobs) == len(c.token_ids) > 0 for g in groups for c in g.completions)
    engine.generate(PROBLEMS[:1], SamplingParams(n=1, temperature=0.0, max_new_tokens=4, seed=11))
    assert vllm_calls.requests[-1][0]["seed"] is None  # greedy: nothing to seed
    with pytest.raises(ValueError, match="rollout.top_k=0 and rollout.top_p=1"):
        engine.generate(PROBLEMS, SamplingParams(n=1, top_k=5))


def distinct_share(completion: str, problem: Problem) -> float:
    """Distinct characters per character: a reward that differs between the tiny model's samples."""
    return len(set(completion)) / len(completion) if completion else 0.0


def test_training_on_the_vllm_engine_syncs_every_update(vllm_calls, tiny_model_dir, tmp_path):
    task = Task(name="letters", train=[Problem(id=str(i), prompt=f"say {i}", answer="a") for i in range(8)], test=[])
    cfg = vllm_config(tiny_model_dir, f"run.dir={tmp_path / 'run'}", "run.progress=false", "run.tensorboard=false",
                      "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=6",
                      "rollout.temperature=1.0", "train.dtype=float32", "train.lr=1e-2", "train.steps=2",
                      "sampling.mask_truncated=false",  # 6 tokens cut nearly every completion: keep their loss
                      "eval.problems=0", "run.save_every=0", "run.sync_check=true")
    train(cfg, task=task, reward=distinct_share)
    # The construction's load, then one per update; the sync check stops a run whose sync missed the model.
    assert len(vllm_calls.loads) == 3 and vllm_calls.loads[1] == vllm_calls.loads[0]
    rollouts = [r for r in vllm_calls.requests if r[0]["n"] == 4]
    assert len(rollouts) == 2 and all(len(r) == 2 and r[0]["max_tokens"] == 6 for r in rollouts)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert max(m.get("sync/changed", 0.0) for m in metrics) > 0  # the check ran, and saw the samples move


@pytest.fixture(scope="module")
def served(talking_model_dir):
    engine = HFEngine(load_model(str(talking_model_dir), dtype=torch.float32, device=CPU), load_tokenizer(str(talking_model_dir)))
    with Server(engine, "tiny") as server:
        yield server, engine


def test_openai_engine_built_from_the_config_samples_the_served_model(served):
    server, local = served
    cfg = load_config(overrides=["model.name=tiny", "rollout.engine=openai", f"rollout.openai_url={server.url}"])
    engine = build_engine(cfg, None, None, CPU)
    assert isinstance(engine, OpenAIEngine) and engine.model == "tiny"
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)
    expected = [g.completions[0].text for g in local.generate(PROBLEMS, greedy)]
    assert all(expected) and [g.completions[0].text for g in engine.generate(PROBLEMS, greedy)] == expected


def test_eval_with_a_config_naming_the_openai_engine_samples_the_server(served, tmp_path, monkeypatch):
    from reasonrl.commands.cli import main

    server, local = served
    asked: list[int] = []
    continue_from = local.continue_from
    monkeypatch.setattr(local, "continue_from", lambda prefixes, sampling, seeds=None: asked.append(len(prefixes))
                        or continue_from(prefixes, sampling, seeds))
    config = tmp_path / "config.toml"
    load_config(overrides=["rollout.engine=openai", f"rollout.openai_url={server.url}"]).save(config)
    out = tmp_path / "eval"
    assert main(["eval", "tiny", "--config", str(config), "--task", "arithmetic", "--limit", "2", "--n", "1",
                 "--temperature", "0", "--max-new-tokens", "4", "--out", str(out), "--no-progress"]) == 0
    assert asked == [1, 1]  # one request per problem reached the server
    assert json.loads((out / "results.json").read_text())["tasks"]["arithmetic"]["problems"] == 2
