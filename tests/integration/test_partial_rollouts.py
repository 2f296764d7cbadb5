"""The continuous batch and partial rollouts: a row admitted into a slot another row left, or paused and
resumed in a later batch, samples what it would have sampled uninterrupted; tokens carry the policy
version that sampled them; a completion spans at most `max_partial_versions` versions; a run trains
with partial rollouts and resumes them from a checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import parameters, share_of_a, tiny_config
from transformers import AutoModelForCausalLM, AutoTokenizer

from reasonrl import Problem, Task, load_config, train
from reasonrl.rollout import HFEngine, fused
from reasonrl.rollout.continuous import ContinuousBatch
from reasonrl.rollout.cuda_graph import StaticDecode
from reasonrl.rollout.fused import KVCache
from reasonrl.rollout.partial import PartialRollouts
from reasonrl.types import SamplingParams

PROBLEMS = [Problem(id=str(i), prompt=f"What is {i} + {3 * i + 1}?" + " Think." * (i % 3), answer=str(4 * i + 1))
            for i in range(8)]
SAMPLED = SamplingParams(n=2, temperature=1.0, max_new_tokens=16, seed=3)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return HFEngine(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                    AutoTokenizer.from_pretrained(tiny_model_dir))


def rows_of(engine, problems, sampling=SAMPLED):
    return engine.rows_for([engine.prompt_ids(p) for p in problems], sampling)


def test_cache_moves_rows_and_columns_without_changing_them():
    cache = KVCache(layers=1, rows=2, kv_heads=1, head_dim=1, capacity=4, dtype=torch.float32, device=torch.device("cpu"))
    cache.keys_LNKSD[0, :, 0, :3, 0] = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    cache.valid_NS[:, :3] = torch.tensor([[False, True, True], [True, True, True]])
    cache.length = 3
    cache.shift(2)  # room for a longer prefix before them
    assert cache.length == 5 and cache.keys_LNKSD[0, :, 0, 2:5, 0].tolist() == [[1, 2, 3], [4, 5, 6]]
    assert cache.valid_NS[:, :2].sum() == 0 and cache.valid_NS[0, 2:5].tolist() == [False, True, True]
    cache.shift(-3)  # drop the leading columns
    assert cache.length == 2 and cache.keys_LNKSD[0, :, 0, :2, 0].tolist() == [[2, 3], [5, 6]]
    cache.add_rows(1)
    source = KVCache(layers=1, rows=1, kv_heads=1, head_dim=1, capacity=1, dtype=torch.float32,
                     device=torch.device("cpu"))
    source.keys_LNKSD[0, 0, 0, 0, 0], source.valid_NS[0, 0], source.length = 9.0, True, 1
    cache.place(torch.tensor([2]), source, torch.tensor([0]))  # ends at the last filled column
    assert cache.keys_LNKSD[0, 2, 0, :2, 0].tolist() == [0, 9] and cache.valid_NS[2, :2].tolist() == [False, True]
    with pytest.raises(ValueError, match="does not fit"):
        source.length = 3
        cache.place(torch.tensor([2]), source, torch.tensor([0]))


def attention_row_by_row(monkeypatch):
    """Every decode step's attention in runs of one row, each from its own first column."""
    monkeypatch.setattr(fused, "ATTENTION_CHUNK_ROWS", 1)
    monkeypatch.setattr(fused, "READ_SHARE", 1.0)


@pytest.mark.parametrize("steps", ["one_product", "row_by_row", "static"])
@pytest.mark.parametrize("max_rows", [1, 3, 5])
def test_a_continuous_batch_samples_what_all_rows_at_once_sample(engine, max_rows, steps, monkeypatch):
    """`static`: the decode steps a CUDA graph replays (tests/integration/test_cuda.py replays them)."""
    together, bounded = rows_of(engine, PROBLEMS[:4]), rows_of(engine, PROBLEMS[:4])
    ContinuousBatch(engine.fused, engine.ends(SAMPLED)).run(together)
    if steps == "row_by_row":
        attention_row_by_row(monkeypatch)
    batch = ContinuousBatch(engine.fused, engine.ends(SAMPLED), max_rows=max_rows,
                            steps=StaticDecode if steps == "static" else None)
    batch.run(bounded)
    assert [row.tokens for row in bounded] == [row.tokens for row in together]
    for a, b in zip(bounded, together):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=1e-5)
    assert batch.stats.prefills >= len(together) / max_rows  # admitted in turns, into the freed slots


@pytest.mark.parametrize("steps", ["one_product", "row_by_row", "static"])
def test_a_paused_and_resumed_row_continues_as_if_never_paused(engine, steps, monkeypatch):
    uninterrupted, paused = rows_of(engine, PROBLEMS[:3]), rows_of(engine, PROBLEMS[:3])
    ContinuousBatch(engine.fused, engine.ends(SAMPLED)).run(uninterrupted)
    if steps == "row_by_row":  # a resumed row's long prefix beside fresh ones: each reads from its own first column
        attention_row_by_row(monkeypatch)
    kind = StaticDecode if steps == "static" else None
    ContinuousBatch(engine.fused, engine.ends(SAMPLED), steps=kind).run(
        paused, enough=lambda: len(paused[0].tokens) >= 5)
    assert any(row.finish is None and row.tokens for row in paused)  # some were paused part-way
    ContinuousBatch(engine.fused, engine.ends(SAMPLED), max_rows=2, version=1, steps=kind).run(paused)  # prefilled again
    assert [row.tokens for row in paused] == [row.tokens for row in uninterrupted]
    assert [row.finish for row in paused] == [row.finish for row in uninterrupted]
    for a, b in zip(paused, uninterrupted):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=1e-5)
    resumed = [row for row in paused if 1 in row.versions]
    assert resumed and all(row.versions == sorted(row.versions) and row.versions[0] == 0 for row in resumed
                           if len(row.tokens) > 5)


def perturbed(tiny_model_dir, scale=0.3):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * scale)
    return model


@pytest.mark.parametrize("max_versions", [1, 2, 3])
def test_versions_are_tagged_and_bounded(tiny_model_dir, max_versions):
    torch.manual_seed(0)
    engine = HFEngine(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                      AutoTokenizer.from_pretrained(tiny_model_dir))
    partial = PartialRollouts(engine, PROBLEMS, max_versions=max_versions)
    sampling = SamplingParams(n=2, temperature=1.0, max_new_tokens=24, seed=1)
    groups, spans, paused = [], [], 0
    for version in range(4):
        start = [PROBLEMS[(2 * version + k) % len(PROBLEMS)] for k in range(2)]
        more = [PROBLEMS[(2 * version + 2 + k) % len(PROBLEMS)] for k in range(partial.shortfall(2))]
        step = partial.generate([*start, *more], SamplingParams(**{**sampling.__dict__, "seed": version}), version,
                                wanted=2)
        assert len(step) == 2
        paused = max(paused, partial.paused())
        for group in step:
            for completion in group.completions:
                versions = completion.token_versions
                assert len(versions) == len(completion.token_ids) and list(versions) == sorted(versions)
                assert completion.policy_version == versions[0] and versions[-1] <= version
                spans.append(len(set(versions)))
        groups += step
        engine.load_weights(perturbed(tiny_model_dir).named_parameters())
    assert max(spans) <= max_versions
    if max_versions == 1:
        assert paused == 0  # nothing generated is left paused: every started row finished
    else:
        assert paused > 0 and max(spans) > 1  # the bound is reached, not merely respected


def test_partial_state_round_trips(engine):
    partial = PartialRollouts(engine, PROBLEMS, max_versions=2)
    partial.generate(PROBLEMS[:4], SAMPLED, 0, wanted=2)
    restored = PartialRollouts(engine, PROBLEMS, max_versions=2)
    restored.load_state_dict(partial.state_dict())
    nxt = SamplingParams(**{**SAMPLED.__dict__, "seed": 9})
    a, b = partial.generate(PROBLEMS[4:6], nxt, 1, wanted=2), restored.generate(PROBLEMS[4:6], nxt, 1, wanted=2)
    assert [(g.problem.id, [c.token_ids for c in g.completions]) for g in a] == \
        [(g.problem.id, [c.token_ids for c in g.completions]) for g in b]


def records(run_dir, name="metrics.jsonl"):
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


TASK = Task(name="sums", train=PROBLEMS, test=PROBLEMS[:4])


def test_a_run_trains_on_partial_rollouts_and_resumes_them(tiny_model_dir, tmp_path):
    overrides = ("rollout.partial=true", "rollout.max_new_tokens=24", "rollout.prompts_per_step=2",
                 "rollout.group_size=4", "eval.problems=2", "run.save_every=2", "train.lr=1e-3")
    train(tiny_config(tiny_model_dir, tmp_path / "straight", "train.steps=4", *overrides), task=TASK, reward=share_of_a)
    steps = [m for m in records(tmp_path / "straight") if "reward/mean" in m]
    assert len(steps) == 4
    assert all("async/token_staleness_mean" in m and "rollout/paused" in m for m in steps)
    assert any(m["async/partial_frac"] > 0 for m in steps[1:])  # completions spanning two versions were trained
    assert any(m["rollout/paused"] > 0 for m in steps)
    train(tiny_config(tiny_model_dir, tmp_path / "resumed", "train.steps=2", *overrides), task=TASK, reward=share_of_a)
    train(tiny_config(tiny_model_dir, tmp_path / "resumed", "train.steps=4", "run.resume=true", *overrides), task=TASK,
          reward=share_of_a)
    straight, resumed = (parameters(tmp_path / run / "checkpoints" / "step_000004" / "policy")
                         for run in ("straight", "resumed"))
    assert any(not torch.equal(straight[name], initial) for name, initial in parameters(tiny_model_dir).items())
    for name in straight:  # the paused completions were in the checkpoint, and continued as they would have
        assert torch.equal(straight[name], resumed[name]), name


def an_agent(base_url: str, model: str, problem: Problem) -> float:
    return 0.0


@pytest.mark.parametrize("override", ["rollout.tree=2x2", "rollout.fused=false", "sampling.adaptive_budget=true",
                                      f"task.agent={__name__}:an_agent"])
def test_partial_rollouts_refuse_what_they_cannot_pause(override):
    # Refused before any model loads (reasonrl.build calls refuse_unsupported first).
    from reasonrl.config.consistency import refuse_unsupported

    with pytest.raises(ValueError, match=f"rollout.partial .* with {override.split('=')[0]}"):
        refuse_unsupported(load_config(overrides=["rollout.partial=true", override, "rollout.group_size=4"]))


def test_max_partial_versions_needs_partial_rollouts():
    from reasonrl.config import ConfigError

    with pytest.raises((ConfigError, ValueError), match="rollout.max_partial_versions"):
        load_config(overrides=["rollout.max_partial_versions=3"])


def test_partial_rollouts_turn_the_importance_correction_on():
    from reasonrl.config.applicability import tis_level

    assert tis_level(load_config(overrides=["rollout.partial=true"])) == "token"
    assert tis_level(load_config(overrides=[])) == ""


def test_staleness_counts_each_token_by_its_version():
    # At step 4: a partial completion sampled by versions 2, 2, 3 is 2, 2, 1 updates behind (mean 5/3)
    # and spans two versions; a whole one of version 3 is 1 behind for each of its 2 tokens.
    from reasonrl.participants import Staleness
    from reasonrl.rollout.producer import Rollouts
    from reasonrl.types import Completion, Group

    def completion(versions):
        return Completion(token_ids=(1,) * len(versions), text="", logprobs=(0.0,) * len(versions),
                          finish_reason="stop", policy_version=min(versions), token_versions=tuple(versions))

    group = Group(problem=PROBLEMS[0], prompt_ids=(1,), completions=(completion((2, 2, 3)), completion((3, 3))))
    metrics = Staleness().metrics(4, Rollouts(sampling=SAMPLED, groups=[group]))
    assert metrics["async/staleness_mean"] == pytest.approx((2 + 1) / 2) and metrics["async/staleness_max"] == 2
    assert metrics["async/token_staleness_mean"] == pytest.approx((2 + 2 + 1 + 1 + 1) / 5)
    assert metrics["async/partial_frac"] == pytest.approx(1 / 2)
