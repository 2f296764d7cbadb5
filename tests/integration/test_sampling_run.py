"""Sampling strategies inside real (tiny) runs: dynamic sampling trains only on informative groups,
overlong filtering takes cut-off completions out of the loss, samplers resume exactly, mixtures
are reported per source."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers import first_character_code, parameters, tiny_config

from reasonrl import Problem, Task, train

MIXTURE = Task(
    name="mixture",
    train=[Problem(id=str(i), prompt=f"say something {i}", answer="a",
                   metadata={"source": "even" if i % 2 == 0 else "odd", "difficulty": i % 3}) for i in range(12)],
    test=[Problem(id=f"t{i}", prompt=f"say more {i}", answer="a", metadata={"source": "even" if i % 2 == 0 else "odd"})
          for i in range(4)],
)


def constant_on_even_sources(completion: str, problem: Problem) -> float:
    """1 on every completion of an "even" problem (a group without spread), 'a' present or not on "odd"."""
    return 1.0 if problem.metadata["source"] == "even" else float("a" in completion)


def solved_on_odd_sources(completion: str, problem: Problem) -> float:
    """1 on every completion of an "even" problem (a group without spread); on "odd" ones, solved when
    one of a-d appears (about 46% of the tiny model's 16-token completions), so that nearly every odd
    group (99%) has solved and unsolved completions whatever tokens are sampled."""
    return 1.0 if problem.metadata["source"] == "even" else float(any(c in "abcd" for c in completion))


def records(run_dir: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


def test_dynamic_sampling_trains_only_on_groups_with_spread(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    train(tiny_config(tiny_model_dir, run, "train.steps=2", "sampling.dynamic=true", "sampling.max_rounds=4",
                      "rollout.prompts_per_step=2", "rollout.max_new_tokens=16", "eval.problems=4"),
          task=MIXTURE, reward=solved_on_odd_sources)
    steps = [m for m in records(run, "metrics.jsonl") if "reward/mean" in m]
    assert sum(m["sampling/dropped_groups"] for m in steps) > 0  # even problems are drawn and dropped
    assert all(m["sampling/dropped_frac"] == pytest.approx(m["sampling/dropped_groups"] / (
        m["sampling/dropped_groups"] + 2 - m["sampling/short_groups"])) for m in steps)  # kept = 2 - short
    for m in steps:
        assert m["sampling/rounds"] >= 1 and m["rollout/zero_std_frac"] == 0.0
        if m["sampling/dropped_groups"]:  # the dropped groups (even: every completion 1) count in the "_all" means
            assert m["sampling/accuracy_all"] > m["reward/mean"] and m["sampling/reward_mean_all"] > m["reward/mean"]
    trained_problem_ids = {r["problem_id"] for r in records(run, "rollouts.jsonl")}
    assert trained_problem_ids and all(int(pid) % 2 == 1 for pid in trained_problem_ids)
    # A mixture: reward and accuracy per source, in training and evaluation
    odd = [r["reward"] for r in records(run, "rollouts.jsonl") if r["step"] == 1]
    assert steps[0]["source/reward_mean/odd"] == pytest.approx(sum(odd) / len(odd))
    evaluated = [m for m in records(run, "metrics.jsonl") if "eval/sampled_reward_mean/even" in m]
    assert evaluated and all(m["eval/sampled_reward_mean/even"] == 1.0 for m in evaluated)  # 1 on every even one


def test_overlong_filtering_leaves_cut_off_completions_out_of_the_loss(tiny_model_dir, tmp_path):
    # Two tokens at most: about half the seeds cut off all 32 completions of the random model (none
    # samples <eos>); the first such seed of ten is used, so that the filtered step has nothing to learn.
    def step_at(seed: int, masked: bool) -> tuple[dict, list[dict]]:
        run = tmp_path / f"{seed}-{masked}"
        train(tiny_config(tiny_model_dir, run, "train.steps=1", f"sampling.mask_truncated={str(masked).lower()}",
                          "rollout.max_new_tokens=2", "run.save_every=1", f"run.seed={seed}"),
              task=MIXTURE, reward=first_character_code)
        return next(m for m in records(run, "metrics.jsonl") if "reward/mean" in m), records(run, "rollouts.jsonl")

    for seed in range(3, 13):
        step, rollouts = step_at(seed, masked=True)
        cut_off = sum(r["finish_reason"] == "length" for r in rollouts)
        assert step["sampling/masked_truncated"] == cut_off
        if cut_off == 32:
            break
    assert cut_off == 32, "no seed of ten cut off every completion"
    unmasked, _ = step_at(seed, masked=False)
    # The same rollouts train only without the filter.
    assert unmasked["train/grad_norm"] > 0 and step["train/grad_norm"] == 0.0
    after = parameters(tmp_path / f"{seed}-True" / "checkpoints" / "step_000001" / "policy")
    before = parameters(tiny_model_dir)
    assert all(torch.equal(after[name], before[name]) for name in before)


def test_band_and_curriculum_samplers_resume_exactly(tiny_model_dir, tmp_path):
    knobs = {"band": ("sampling.band_low=0.1", "sampling.band_high=0.9"), "pass_rate": ("sampling.advance_at=0.3",)}
    for sampler in ("band", "pass_rate"):
        extra = (f"sampling.problems={sampler}", *knobs[sampler], "rollout.prompts_per_step=2")
        reward = constant_on_even_sources
        train(tiny_config(tiny_model_dir, tmp_path / sampler / "straight", "train.steps=4", *extra),
              task=MIXTURE, reward=reward)
        train(tiny_config(tiny_model_dir, tmp_path / sampler / "resumed", "train.steps=2", "run.save_every=2", *extra),
              task=MIXTURE, reward=reward)
        train(tiny_config(tiny_model_dir, tmp_path / sampler / "resumed", "train.steps=4", "run.resume=true", *extra),
              task=MIXTURE, reward=reward)
        drawn = {run: [r["problem_id"] for r in records(tmp_path / sampler / run, "rollouts.jsonl")]
                 for run in ("straight", "resumed")}
        assert drawn["straight"] == drawn["resumed"], sampler


THREE = Task(name="three", train=[Problem(id=name, prompt=f"say {name}", answer="a") for name in ("solved", "coin",
                                                                                            "hopeless")],
             test=[Problem(id="t", prompt="say t", answer="a")])


def solved_coin_hopeless(completion: str, problem: Problem) -> float:
    return {"solved": 1.0, "hopeless": 0.0}.get(problem.id, float("a" in completion))


def test_adaptive_budget_gives_failing_problems_more_samples_and_resumes_exactly(tiny_model_dir, tmp_path):
    extra = ("sampling.adaptive_budget=true", "rollout.prompts_per_step=3", "rollout.group_size=4",
             "train.micro_batch_size=12")
    train(tiny_config(tiny_model_dir, tmp_path / "straight", "train.steps=4", *extra), task=THREE,
          reward=solved_coin_hopeless)
    train(tiny_config(tiny_model_dir, tmp_path / "resumed", "train.steps=2", "run.save_every=2", *extra),
          task=THREE, reward=solved_coin_hopeless)
    train(tiny_config(tiny_model_dir, tmp_path / "resumed", "train.steps=4", "run.resume=true", *extra),
          task=THREE, reward=solved_coin_hopeless)
    rollouts = {run: records(tmp_path / run, "rollouts.jsonl") for run in ("straight", "resumed")}
    assert [r["completion"] for r in rollouts["straight"]] == [r["completion"] for r in rollouts["resumed"]]
    sizes: dict[tuple[int, str], int] = {}
    for r in rollouts["straight"]:
        sizes[r["step"], r["problem_id"]] = sizes.get((r["step"], r["problem_id"]), 0) + 1
    assert [sizes[1, name] for name in ("solved", "coin", "hopeless")] == [4, 4, 4]  # nothing known yet
    # From step 2 on: pass rates 1 and 0 -> weights 0.1 and 1.0 (coin in between); 12 in total, 2 at least.
    for step in (2, 3, 4):
        assert sum(sizes[step, name] for name in ("solved", "coin", "hopeless")) == 12
        assert sizes[step, "solved"] == 2 < sizes[step, "hopeless"]


def only_the_first_answer() -> Callable[[str, Problem], float]:
    """A reward calling correct exactly the first completion it ever scores for a problem (the
    tiny model's later samples differ from it): the replay buffer's one success."""
    first_answer: dict[str, str] = {}

    def reward(completion: str, problem: Problem) -> float:
        return float(first_answer.setdefault(problem.id, completion) == completion)

    return reward


def test_replay_puts_an_earlier_success_into_an_all_wrong_group(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    train(tiny_config(tiny_model_dir, run, "train.steps=3", "sampling.replay=2", "algo.tis=token",
                      "rollout.prompts_per_step=1", "rollout.group_size=4", "rollout.max_new_tokens=8"),
          task=Task(name="one", train=[THREE.train[0]], test=THREE.test), reward=only_the_first_answer())
    by_step: dict[int, list[dict]] = {}
    for r in records(run, "rollouts.jsonl"):
        by_step.setdefault(r["step"], []).append(r)
    first = by_step[1][0]["completion"]
    steps = [m for m in records(run, "metrics.jsonl") if "reward/mean" in m]
    # Step 1 stores its first completion; later groups (all different from it) get it back as their last one.
    for step in (2, 3):
        assert by_step[step][-1]["completion"] == first and by_step[step][-1]["reward"] == 1.0
        assert all(r["reward"] == 0.0 for r in by_step[step][:-1])
    assert steps[-1]["sampling/replayed"] == 2.0


def test_masked_importance_sampling_drops_a_replayed_completion_the_policy_has_left(tiny_model_dir, tmp_path):
    # A replayed completion keeps the log-probs of the step-1 policy. After an update at lr 1e-2 its
    # sequence ratio is far outside [0.99, 1.01], while the fresh samples (sampled and scored by the
    # same fp32 weights) sit at 1: the sequence mask must drop exactly the replayed one of each group.
    run = tmp_path / "run"
    train(tiny_config(tiny_model_dir, run, "train.steps=3", "sampling.replay=2", "algo.mis=sequence",
                      "algo.mis_low=0.99", "algo.mis_high=1.01", "rollout.prompts_per_step=1",
                      "rollout.group_size=4", "rollout.max_new_tokens=8"),
          task=Task(name="one", train=[THREE.train[0]], test=THREE.test), reward=only_the_first_answer())
    steps = [m for m in records(run, "metrics.jsonl") if "reward/mean" in m]
    assert [m["rollout/masked_seq_frac"] for m in steps] == [0.0, 0.25, 0.25]
    assert steps[-1]["sampling/replayed"] == 2.0


def test_stages_change_length_group_size_and_sources(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    train(tiny_config(tiny_model_dir, run, "train.steps=4", "rollout.prompts_per_step=2", "rollout.group_size=4",
                      "sampling.stages=['0: max_new_tokens=2 sources=even', '2: max_new_tokens=6 group_size=2 "
                      "sources=odd']"),
          task=MIXTURE, reward=first_character_code)
    for r in records(run, "rollouts.jsonl"):
        early = r["step"] <= 2
        assert r["num_tokens"] <= (2 if early else 6)
        assert int(r["problem_id"]) % 2 == (0 if early else 1)
    per_step = [sum(r["step"] == step for r in records(run, "rollouts.jsonl")) for step in range(1, 5)]
    assert per_step == [8, 8, 4, 4]


def test_a_pass_rate_curriculum_over_reasoning_gym_difficulty_levels(tiny_model_dir, tmp_path):
    pytest.importorskip("reasoning_gym")
    from reasonrl.build import build_task

    levels = ('[{"min_digits": 1, "max_digits": 1, "min_terms": 2, "max_terms": 2}, '
              '{"min_digits": 3, "max_digits": 3, "min_terms": 2, "max_terms": 2}]')
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", "train.steps=2", "task.name=environment",
                      "task.environment=basic_arithmetic", f"task.environment_levels={levels}", "task.train_size=8",
                      "task.test_size=2", "sampling.problems=pass_rate", "reward.format_weight=0")
    task = build_task(cfg)
    assert sorted({p.metadata["difficulty"] for p in task.train}) == [0, 1]
    for problem in task.train:  # level 0 holds one-digit operands only
        assert problem.metadata["entry"]["metadata"]["num_digits"] == (1 if problem.metadata["difficulty"] == 0 else 3)
    train(cfg)
    trained = {r["problem_id"] for r in records(tmp_path / "run", "rollouts.jsonl")}
    assert trained and all(pid.startswith("level0-") for pid in trained)  # the first level until it is learned
