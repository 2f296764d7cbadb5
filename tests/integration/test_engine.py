"""The hf engine (fused decoder and transformers forward) against transformers itself: sampled log-probs equal a teacher-forced forward
pass, greedy decoding equals `model.generate`, stop strings and length limits behave. "continuous" is the
fused decoder in a continuous batch of 2 rows (rollout/continuous.py), so every call admits rows into
slots freed by others, at other columns than their own prompt's width."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from reasonrl.rollout import HFEngine
from reasonrl.training.learner import make_train_batch
from reasonrl.training.token_stats import token_logprobs
from reasonrl.types import Problem, SamplingParams

PROBLEMS = [Problem(id="a", prompt="What is 1 + 2?", answer="3"),
            Problem(id="b", prompt="Add 12 and 30, then say it", answer="42")]


@pytest.fixture(scope="module", params=[(True, 0), (False, 0), (True, 2)], ids=["fused", "transformers", "continuous"])
def engine(tiny_model_dir, request):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    fused, max_rows = request.param
    return HFEngine(model, AutoTokenizer.from_pretrained(tiny_model_dir), fused=fused, max_rows=max_rows)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_teacher_forced_forward(engine, temperature):
    sampling = SamplingParams(n=3, temperature=temperature, max_new_tokens=12, seed=5)
    groups = engine.generate(PROBLEMS, sampling)
    assert [g.size for g in groups] == [3, 3]
    batch = make_train_batch(groups, [0.0] * 6, engine.pad_id)
    with torch.no_grad():
        logp_NT, _ = token_logprobs(engine.model, batch, temperature)
    mask = batch.loss_mask_NT.bool()
    assert mask.sum() == sum(len(c.token_ids) for g in groups for c in g.completions)
    torch.testing.assert_close(logp_NT[mask], batch.sampling_logp_NT[mask], atol=1e-4, rtol=1e-4)


def test_greedy_equals_model_generate(engine):
    groups = engine.generate(PROBLEMS, SamplingParams(n=1, temperature=0.0, max_new_tokens=10))
    for group in groups:
        prompt = torch.tensor([list(group.prompt_ids)])
        reference = engine.model.generate(prompt, max_new_tokens=10, do_sample=False,
                                          eos_token_id=engine.tokenizer.eos_token_id, pad_token_id=engine.pad_id)
        completion = group.completions[0]
        assert list(completion.token_ids) == reference[0, prompt.shape[1]:].tolist()
        assert completion.finish_reason == ("stop" if completion.token_ids[-1] in engine.eos_ids else "length")


def test_top_k_one_is_greedy_and_seed_reproduces(engine):
    greedy = engine.generate(PROBLEMS, SamplingParams(n=1, temperature=0.0, max_new_tokens=8))
    top1 = engine.generate(PROBLEMS, SamplingParams(n=2, temperature=1.0, top_k=1, max_new_tokens=8, seed=3))
    for g, t in zip(greedy, top1):
        assert all(c.token_ids == g.completions[0].token_ids for c in t.completions)
    sampling = SamplingParams(n=4, temperature=1.0, max_new_tokens=8, seed=11)
    first, second = engine.generate(PROBLEMS, sampling), engine.generate(PROBLEMS, sampling)
    assert [c.token_ids for g in first for c in g.completions] == [c.token_ids for g in second for c in g.completions]


def test_top_p_restricts_to_the_nucleus(engine):
    # With top_p tiny, only the most likely token can be drawn: the same as greedy.
    greedy = engine.generate(PROBLEMS, SamplingParams(n=1, temperature=0.0, max_new_tokens=8))
    nucleus = engine.generate(PROBLEMS, SamplingParams(n=3, temperature=1.0, top_p=1e-6, max_new_tokens=8, seed=2))
    for g, t in zip(greedy, nucleus):
        assert all(c.token_ids == g.completions[0].token_ids for c in t.completions)


def test_length_limit_and_stop_strings(engine):
    long = engine.generate(PROBLEMS[:1], SamplingParams(n=4, temperature=1.0, max_new_tokens=30, seed=1))
    for completion in long[0].completions:
        assert len(completion.token_ids) <= 30
        assert len(completion.logprobs) == len(completion.token_ids)
        assert completion.finish_reason in ("stop", "length")
    # Stop at the first character every sample produced: each completion then ends right there.
    text = long[0].completions[0].text
    stop = text[0] if text else "a"
    stopped = engine.generate(PROBLEMS[:1], SamplingParams(n=4, temperature=1.0, max_new_tokens=30, seed=1, stop=(stop,)))
    for completion in stopped[0].completions:
        assert stop not in completion.text
        if completion.finish_reason == "stop" and completion.token_ids[-1] not in engine.eos_ids:
            assert stop in engine.tokenizer.decode(list(completion.token_ids))


def test_ignore_eos_decodes_every_row_to_the_limit_past_its_end_tokens(engine):
    # The tiny model samples its end token about once in 100: of 32 rows of 40 tokens some end early
    # (all run on with probability ~1e-5). With ignore_eos each row runs to max_new_tokens, and its
    # first tokens are those of the run that stopped.
    sampling = SamplingParams(n=32, temperature=1.0, max_new_tokens=40, seed=2)
    stopped = engine.generate(PROBLEMS[:1], sampling)[0].completions
    assert any(c.finish_reason == "stop" and c.token_ids[-1] in engine.eos_ids for c in stopped)
    full = engine.generate(PROBLEMS[:1], replace(sampling, ignore_eos=True))[0].completions
    assert all(len(c.token_ids) == 40 and c.finish_reason == "length" for c in full)
    assert any(token in engine.eos_ids for c in full for token in c.token_ids)
    for short, long in zip(stopped, full):
        assert long.token_ids[:len(short.token_ids)] == short.token_ids


def test_load_weights_changes_the_policy(engine, tiny_model_dir):
    other = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    # An engine of the fixture's kind (fused decoder, continuous batch) whose weights are replaced
    # decodes as one built on the new weights does: the fused decoder's packed copy follows them.
    fresh = HFEngine(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), engine.tokenizer,
                     fused=engine.fused is not None, max_rows=engine.max_rows)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=10)
    before = [g.completions[0].token_ids for g in fresh.generate(PROBLEMS, greedy)]
    fresh.load_weights(other.named_parameters())
    for (name, a), (_, b) in zip(fresh.model.named_parameters(), other.named_parameters()):
        assert torch.equal(a, b), name
    built_on_them = HFEngine(other, engine.tokenizer, fused=False)
    after = [g.completions[0].token_ids for g in fresh.generate(PROBLEMS, greedy)]
    assert after == [g.completions[0].token_ids for g in built_on_them.generate(PROBLEMS, greedy)]
    assert after != before


@pytest.mark.parametrize("fused,max_rows", [(True, 0), (False, 0), (True, 3000)])
def test_sampling_distribution_matches_the_model(tmp_path, fused, max_rows):
    # Chi-square goodness of fit of the engine's first sampled token against softmax(logits / T)
    # from a plain forward pass: 8000 draws from one prompt, tokens with expected count < 5 pooled.
    # The model's weights are large enough that its logits are far from flat, so a sampler at the
    # wrong temperature is detectably wrong.
    from helpers import build_tiny_model

    model_dir = build_tiny_model(tmp_path, initializer_range=0.3)
    engine = HFEngine(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
                      AutoTokenizer.from_pretrained(model_dir), fused=fused, max_rows=max_rows)
    temperature, draws = 0.8, 8000
    problem = PROBLEMS[0]
    groups = engine.generate([problem], SamplingParams(n=draws, temperature=temperature, max_new_tokens=1, seed=7))
    counts = torch.bincount(torch.tensor([c.token_ids[0] for c in groups[0].completions]),
                            minlength=engine.model.config.vocab_size).double()
    with torch.no_grad():
        logits = engine.model(torch.tensor([engine.prompt_ids(problem)])).logits[0, -1].double()
    expected = torch.softmax(logits / temperature, dim=-1) * draws
    frequent = expected >= 5

    def bins(values: torch.Tensor) -> torch.Tensor:
        pooled = values[~frequent].sum()[None]
        return torch.cat([values[frequent], pooled]) if bool((~frequent).any()) else values[frequent]

    observed_bins, expected_bins = bins(counts), bins(expected)
    chi2 = float(((observed_bins - expected_bins) ** 2 / expected_bins).sum())
    dof = len(observed_bins) - 1
    # 99.9th percentile of chi-square(dof) by the Wilson-Hilferty approximation.
    z = 3.09
    critical = dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3
    assert dof > 10 and chi2 < critical, (chi2, critical, dof)
    # A sampler at the wrong temperature fails the same test: the test can tell.
    wrong = torch.softmax(logits / 1.3, dim=-1) * draws
    wrong_bins = bins(wrong)
    assert float(((observed_bins - wrong_bins) ** 2 / wrong_bins).sum()) > critical


def test_generation_uses_the_synced_weights(engine, tiny_model_dir):
    trained = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    stale = HFEngine(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), engine.tokenizer,
                     fused=engine.fused is not None, max_rows=engine.max_rows)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=12)
    before = [g.completions[0].token_ids for g in stale.generate(PROBLEMS, greedy)]
    stale.load_weights(trained.named_parameters())
    synced = [g.completions[0].token_ids for g in stale.generate(PROBLEMS, greedy)]
    reference = HFEngine(trained, engine.tokenizer, fused=False)
    expected = [g.completions[0].token_ids for g in reference.generate(PROBLEMS, greedy)]
    assert synced == expected and synced != before
