"""The CUDA paths against their CPU or transformers references: the engine's sampled log-probs and
greedy decoding, the fused LM head under bfloat16 autocast, and activation checkpointing's
gradients, on a GPU. Skipped on machines without CUDA; on one, the end-to-end tests of
test_train.py and test_algorithms.py also run there (`run.device=auto` picks the GPU)."""

from __future__ import annotations

import pytest
import torch
from helpers import TASK, share_of_a, tiny_config
from transformers import AutoModelForCausalLM, AutoTokenizer

from reasonrl import train
from reasonrl.models import pick_device
from reasonrl.rollout import HFEngine
from reasonrl.training.learner import make_train_batch
from reasonrl.training.token_stats import token_logprobs
from reasonrl.types import Problem, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda")
PROBLEMS = [Problem(id="a", prompt="What is 1 + 2?", answer="3"),
            Problem(id="b", prompt="Add 12 and 30, then say it", answer="42")]


def test_auto_device_is_the_gpu():
    assert pick_device("auto") == CUDA


@pytest.fixture(scope="module", params=[(True, True), (True, False), (False, False)],
                ids=["fused_captured", "fused_eager", "transformers"])
def engine(tiny_model_dir, request):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).to(CUDA)
    fused, cuda_graphs = request.param
    return HFEngine(model, AutoTokenizer.from_pretrained(tiny_model_dir), fused=fused, cuda_graphs=cuda_graphs)


def test_captured_decode_steps_sample_what_eager_steps_sample(tiny_model_dir, monkeypatch):
    from reasonrl.rollout import cuda_graph

    captured_rows = []
    capture = cuda_graph.CapturedDecode._capture
    monkeypatch.setattr(cuda_graph.CapturedDecode, "_capture",
                        lambda self, rows: (captured_rows.append(rows), capture(self, rows)))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).to(CUDA)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    sampling = SamplingParams(n=4, temperature=0.7, max_new_tokens=24, seed=3)
    captured = HFEngine(model, tokenizer).generate(PROBLEMS, sampling)
    eager = HFEngine(model, tokenizer, cuda_graphs=False).generate(PROBLEMS, sampling)
    assert captured_rows and captured_rows[0] == 8  # both prompts' 4 samples, one graph per cache
    for captured_group, eager_group in zip(captured, eager):
        for a, b in zip(captured_group.completions, eager_group.completions):
            assert a.token_ids == b.token_ids
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_a_continuous_batch_with_captured_steps_samples_what_eager_steps_sample(tiny_model_dir, monkeypatch, dtype):
    """A row limit (admissions into freed slots, compaction) and a pause and resume: the batch's
    cache is reallocated often, and each change captures again."""
    from reasonrl.rollout import cuda_graph
    from reasonrl.rollout.continuous import ContinuousBatch

    captures = []
    capture = cuda_graph.CapturedDecode._capture
    monkeypatch.setattr(cuda_graph.CapturedDecode, "_capture",
                        lambda self, rows: (captures.append(rows), capture(self, rows)))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype).to(CUDA)
    engine = HFEngine(model, AutoTokenizer.from_pretrained(tiny_model_dir), max_rows=3)
    assert engine.continuous_steps() is cuda_graph.CapturedDecode
    sampling = SamplingParams(n=2, temperature=1.0, max_new_tokens=16, seed=3)
    prefixes = [engine.prompt_ids(problem) for problem in PROBLEMS]

    def decoded(steps):
        rows = engine.rows_for(prefixes, sampling)
        first = ContinuousBatch(engine.fused, engine.ends(sampling), max_rows=3, steps=steps)
        first.run(rows, enough=lambda: len(rows[0].tokens) >= 5)
        assert any(row.finish is None and row.tokens for row in rows)  # some were paused part-way
        ContinuousBatch(engine.fused, engine.ends(sampling), max_rows=3, version=1, steps=steps).run(rows)
        return rows, first.stats

    (captured, stats), (eager, _) = decoded(cuda_graph.CapturedDecode), decoded(cuda_graph.StaticDecode)
    assert len(captures) > 2  # captured again after admissions and compactions
    assert 0 < stats.graph_captures < len(captures) and stats.graph_capture_s > 0  # the first batch's share
    assert [row.tokens for row in captured] == [row.tokens for row in eager]
    for a, b in zip(captured, eager):
        assert a.versions == b.versions
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=1e-4)


def test_sampled_logprobs_equal_a_teacher_forced_forward_on_the_gpu(engine):
    groups = engine.generate(PROBLEMS, SamplingParams(n=3, temperature=0.7, max_new_tokens=12, seed=5))
    batch = make_train_batch(groups, [0.0] * 6, engine.pad_id).to(CUDA)
    with torch.no_grad():
        logp_NT, _ = token_logprobs(engine.model, batch, 0.7)
    mask = batch.loss_mask_NT.bool()
    assert mask.sum() == sum(len(c.token_ids) for g in groups for c in g.completions) > 0
    # TF32 matrix products on the GPU: looser than the CPU test's 1e-4.
    torch.testing.assert_close(logp_NT[mask], batch.sampling_logp_NT[mask], atol=2e-3, rtol=2e-3)


def test_greedy_equals_model_generate_on_the_gpu(engine):
    groups = engine.generate(PROBLEMS, SamplingParams(n=1, temperature=0.0, max_new_tokens=10))
    for group in groups:
        prompt = torch.tensor([group.prompt_ids], device=CUDA)
        expected = engine.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=10,
                                         do_sample=False, pad_token_id=engine.pad_id)
        produced = list(group.prompt_ids) + list(group.completions[0].token_ids)
        assert expected[0, :len(produced)].tolist() == produced


def test_fused_head_under_bfloat16_autocast_matches_the_autocast_head_on_the_gpu(monkeypatch):
    from helpers import fused_head_against_the_autocast_head

    fused_head_against_the_autocast_head(monkeypatch, "cuda")


@pytest.mark.parametrize("pack", [True, False])
def test_every_checkpointing_mode_gives_the_gradients_of_keeping_everything_on_the_gpu(pack):
    from helpers import batch, tiny_llama

    from reasonrl.algo.aggregation import token_mean
    from reasonrl.algo.objectives import ppo_clip
    from reasonrl.training.learner import Learner, OptimConfig, PolicyLoss

    def gradients(mode: str, positions: int = 0) -> dict[str, torch.Tensor]:
        model = tiny_llama(mode, positions).to(CUDA)
        learner = Learner(model, OptimConfig(lr=0.0, grad_clip=0.0), pack=pack, autocast_dtype=torch.bfloat16)
        learner.update(batch(), PolicyLoss(objective=ppo_clip, aggregation=token_mean, entropy_coef=0.01),
                       micro_batch_size=4)
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    kept = gradients("off")
    assert all(g.device.type == "cuda" for g in kept.values()) and sum(g.abs().sum() for g in kept.values()) > 0
    for mode, positions in (("selective", 0), ("full", 0), ("auto", 8)):
        recomputed = gradients(mode, positions)
        for name in kept:
            torch.testing.assert_close(recomputed[name], kept[name], atol=1e-5, rtol=1e-4, msg=f"{mode} {name}")


def test_a_bfloat16_run_on_the_gpu_starts_every_step_at_ratio_one_and_learns(tiny_model_dir, tmp_path):
    import json

    run = tmp_path / "gpu"
    train(tiny_config(tiny_model_dir, run, "run.device=cuda", "train.steps=30", "train.dtype=bfloat16",
                      "rollout.dtype=bfloat16", "train.mini_batches=2"), task=TASK, reward=share_of_a)
    updates = [json.loads(line) for line in (run / "updates.jsonl").read_text().splitlines()]
    assert all(u["loss/ratio_mean"] == 1.0 for u in updates if u["optimizer_step"] == 0)
    rewards = [json.loads(line)["reward/mean"] for line in (run / "metrics.jsonl").read_text().splitlines()
               if "reward/mean" in line]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:3]) / 3 + 0.5, rewards
