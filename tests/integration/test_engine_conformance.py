"""What every rollout engine must do, checked against transformers on the same weights: greedy
decoding equals `model.generate`, sampled log-probs equal a teacher-forced forward pass under
logits / temperature, `load_weights` switches the weights it generates with, and `n`
completions come back per problem in problem order. Runs against the hf engine always, against
the vllm engine when vLLM imports and a CUDA GPU is present."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from reasonrl.rollout import HFEngine, prompt_token_ids
from reasonrl.training.learner import make_train_batch
from reasonrl.training.token_stats import token_logprobs
from reasonrl.types import Problem, SamplingParams

PROBLEMS = [Problem(id="a", prompt="What is 1 + 2?", answer="3"),
            Problem(id="b", prompt="Add 12 and 30, then say it", answer="42"),
            Problem(id="c", prompt="7 * 6 = ?", answer="42")]

HAS_VLLM = importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


def hf_engine(model_dir: Path) -> HFEngine:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return HFEngine(model, AutoTokenizer.from_pretrained(model_dir))


def vllm_engine(model_dir: Path) -> Any:
    from reasonrl.rollout.vllm import VLLMEngine

    return VLLMEngine(str(model_dir), AutoTokenizer.from_pretrained(model_dir), dtype="float32",
                      gpu_memory_utilization=0.2, enforce_eager=True)


ENGINES: dict[str, Callable[[Path], Any]] = {"hf": hf_engine, "vllm": vllm_engine}


@pytest.fixture(scope="module", params=[
    "hf", pytest.param("vllm", marks=pytest.mark.skipif(not HAS_VLLM, reason="vLLM or a CUDA GPU is absent"))])
def engine(model_dir, request):
    torch.set_num_threads(1)
    return ENGINES[request.param](model_dir)


def wide_tiny_model(directory: Path, seed: int) -> Path:
    """A tiny random model initialised wide enough that greedy decoding varies with the prompt
    and the weights (the default tiny model repeats one token whatever it is given)."""
    from helpers import build_tiny_model

    return build_tiny_model(directory, seed=seed, initializer_range=0.5)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return wide_tiny_model(tmp_path_factory.mktemp("conformance-model"), seed=0)


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory) -> Path:
    return wide_tiny_model(tmp_path_factory.mktemp("conformance-other-model"), seed=1)


def reference(model_dir: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def greedy_reference(model: Any, tokenizer: Any, prompt_ids: tuple[int, ...], max_new_tokens: int) -> list[int]:
    prompt = torch.tensor([list(prompt_ids)])
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens,
                         do_sample=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return out[0, prompt.shape[1]:].tolist()


def test_greedy_equals_transformers_generate(engine, model_dir):
    model, tokenizer = reference(model_dir), AutoTokenizer.from_pretrained(model_dir)
    for group in engine.generate(PROBLEMS, SamplingParams(n=1, temperature=0.0, max_new_tokens=10)):
        assert list(group.completions[0].token_ids) == greedy_reference(model, tokenizer, group.prompt_ids, 10)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_teacher_forced_forward(engine, model_dir, temperature):
    groups = engine.generate(PROBLEMS, SamplingParams(n=2, temperature=temperature, max_new_tokens=12, seed=3))
    batch = make_train_batch(groups, [0.0] * 6, pad_id=engine.pad_id)
    with torch.no_grad():
        logp_NT, _ = token_logprobs(reference(model_dir), batch, temperature)
    mask_NT = batch.loss_mask_NT.bool()
    assert int(mask_NT.sum()) == sum(len(c.token_ids) for g in groups for c in g.completions)
    torch.testing.assert_close(batch.sampling_logp_NT[mask_NT], logp_NT[mask_NT], atol=2e-4, rtol=1e-4)


def test_generates_with_the_weights_it_was_given(engine, model_dir, other_model_dir):
    other, tokenizer = reference(other_model_dir), AutoTokenizer.from_pretrained(other_model_dir)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=10)
    before = [g.completions[0].token_ids for g in engine.generate(PROBLEMS, greedy)]
    try:
        engine.load_weights(other.named_parameters())
        groups = engine.generate(PROBLEMS, greedy)
        after = [g.completions[0].token_ids for g in groups]
        for group in groups:
            assert list(group.completions[0].token_ids) == greedy_reference(other, tokenizer, group.prompt_ids, 10)
        assert after != before  # the two random models do not decode alike: the check can fail
    finally:
        engine.load_weights(reference(model_dir).named_parameters())


def test_n_completions_per_problem_in_problem_order(engine, model_dir):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    groups = engine.generate(PROBLEMS, SamplingParams(n=3, temperature=1.0, max_new_tokens=6, seed=0))
    assert [g.problem.id for g in groups] == ["a", "b", "c"]
    assert [g.size for g in groups] == [3, 3, 3]
    for group, problem in zip(groups, PROBLEMS):
        assert list(group.prompt_ids) == prompt_token_ids(tokenizer, problem, chat_template=True)
        for completion in group.completions:
            assert 1 <= len(completion.token_ids) <= 6 and len(completion.logprobs) == len(completion.token_ids)
    # Greedy output follows its problem, whatever the order the problems come in.
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
    forward = engine.generate(PROBLEMS, greedy)
    backward = engine.generate(PROBLEMS[::-1], greedy)
    assert [g.completions[0].token_ids for g in forward] == [g.completions[0].token_ids for g in backward[::-1]]
