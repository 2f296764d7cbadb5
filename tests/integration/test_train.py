"""End to end on a tiny random model: it learns, a flipped advantage sign unlearns, a resumed run
continues exactly, bad input stops the run with a message naming the cause."""

from __future__ import annotations

import json
import time

import pytest
import torch
from helpers import (
    TASK,
    build_tiny_model,
    first_character_code,
    glibc_only,
    parameters,
    reward_curve,
    share_of_a,
    tiny_config,
    train_straight_and_resumed,
)
from transformers import AutoModelForCausalLM

from reasonrl import Problem, Task, load_config, train
from reasonrl.allocator import heap_in_use_bytes
from reasonrl.rewards import RewardError
from reasonrl.training import runtime
from reasonrl.training.checkpoint import checkpoints
from reasonrl.training.learner import NonFiniteLossError


def test_tiny_model_learns_with_lora(tmp_path):
    # LoRA leaves the (tied) output embedding frozen; with the usual 0.02 init its logits span too
    # little for any hidden state to favour one letter, so this model starts with larger weights.
    model_dir = build_tiny_model(tmp_path / "model", initializer_range=0.3)
    train(tiny_config(model_dir, tmp_path / "lora", "train.steps=30", "train.lora_rank=8", "train.lora_alpha=16",
                      "train.lr=1e-2"), task=TASK, reward=share_of_a)
    curve = reward_curve(tmp_path / "lora")
    assert sum(curve[-5:]) / 5 > sum(curve[:3]) / 3 + 0.3, curve


def test_tiny_model_learns_and_a_flipped_sign_does_not(tiny_model_dir, tmp_path):
    steps = "train.steps=30"
    train(tiny_config(tiny_model_dir, tmp_path / "up", steps), task=TASK, reward=share_of_a)
    up = reward_curve(tmp_path / "up")
    train(tiny_config(tiny_model_dir, tmp_path / "down", steps, "algo.advantage=helpers:negated_grpo"),
          task=TASK, reward=share_of_a)
    down = reward_curve(tmp_path / "down")
    start = sum(up[:3]) / 3
    assert down[0] == pytest.approx(up[0])  # same model, same seed: the same first rollouts
    assert sum(up[-5:]) / 5 > start + 0.5, up
    assert sum(down[-5:]) / 5 < start, down


def test_resume_continues_exactly(tiny_model_dir, tmp_path):
    # Two PPO epochs x two mini-batches, so the optimizer state and shuffles matter too.
    train_straight_and_resumed(tiny_model_dir, tmp_path, "train.ppo_epochs=2", "train.mini_batches=2",
                               "train.micro_batch_size=5")
    straight = parameters(tmp_path / "straight" / "checkpoints" / "step_000004" / "policy")
    resumed = parameters(tmp_path / "resumed" / "checkpoints" / "step_000004" / "policy")
    initial = parameters(tiny_model_dir)
    assert any(not torch.equal(straight[name], initial[name]) for name in straight)
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    assert reward_curve(tmp_path / "straight") == reward_curve(tmp_path / "resumed")


def test_run_directory_contents_and_refusal_to_overwrite(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    cfg = tiny_config(tiny_model_dir, run, "train.steps=2", "run.save_every=1", "run.keep_checkpoints=1",
                      "eval.problems=2", "eval.samples=2", "algo.kl_coef=0.1")
    result = train(cfg, task=TASK, reward=first_character_code)  # a spread in every group: step 1 updates
    assert result.steps == 2 and set(result.eval_after) >= {"eval/greedy_reward_mean", "eval/sampled_reward_mean"}
    assert [p.name for p in checkpoints(run)] == ["step_000002"]  # keep_checkpoints=1
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    assert load_config(run / "config.toml") == cfg
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    step_metrics = [m for m in metrics if "loss/policy" in m]
    for key in ("reward/mean", "reward/reward", "loss/policy", "loss/clip_frac", "kl/mean", "entropy/mean",
                "rollout/len_mean", "perf/tokens_per_s", "train/grad_norm"):
        assert key in step_metrics[0], key
    assert step_metrics[0]["kl/mean"] == pytest.approx(0.0, abs=1e-6)  # the policy starts at the reference
    assert step_metrics[1]["kl/mean"] > 0
    rollouts = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 2 * 4 * 8
    assert {"prompt", "completion", "reward", "components", "advantage"} <= set(rollouts[0])
    with pytest.raises(FileExistsError, match="run.resume=true"):
        train(cfg, task=TASK, reward=share_of_a)


def test_a_step_time_is_split_into_generation_scoring_update_and_sync_and_its_memory_logged(tiny_model_dir, tmp_path):
    pause = 0.01

    def slow(completion: str, problem: Problem) -> float:
        time.sleep(pause)
        return share_of_a(completion, problem)

    run = tmp_path / "run"
    train(tiny_config(tiny_model_dir, run, "train.steps=2", "eval.problems=0"), task=TASK, reward=slow)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "loss/policy" in m]
    assert len(steps) == 2
    for step in steps:
        assert step["perf/score_s"] >= 4 * 8 * pause  # every completion scored once, inside score_s
        assert step["perf/generate_s"] + step["perf/score_s"] <= step["perf/step_s"]
        assert 0 < step["perf/sync_s"] <= step["perf/update_s"] <= step["perf/step_s"]
        # memory after the step (Linux, on glibc's malloc or tcmalloc, which count it): the process holds at
        # least what live allocations hold
        if heap_in_use_bytes() is not None:
            assert 0 < step["perf/heap_in_use_gb"] <= step["perf/rss_gb"]
        else:  # under an allocator that keeps no count (mimalloc)
            assert "perf/heap_in_use_gb" not in step and step["perf/rss_gb"] > 0


@glibc_only
def test_memory_kept_past_the_bound_is_given_back_after_a_step(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "KEPT_MEMORY_GROWTH", -(2**40))  # every step past a reference is past the bound
    run = tmp_path / "run"
    # On a CPU: only there is freed memory kept (and bounded).
    train(tiny_config(tiny_model_dir, run, "train.steps=4", "eval.problems=0", "run.device=cpu"), task=TASK,
          reward=share_of_a)
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # A reference after the first step and after each step that follows a release; a release after the others.
    assert ["perf/released_gb" in step for step in steps if "perf/step_s" in step] == [False, True, False, True]


def test_a_raising_reward_stops_the_run_with_the_sample(tiny_model_dir, tmp_path):
    def broken(completion: str, problem: Problem) -> float:
        raise KeyError("no such field")

    with pytest.raises(RewardError, match=r"problem '\d+'.*completion") as info:
        train(tiny_config(tiny_model_dir, tmp_path / "run", "train.steps=1"), task=TASK, reward=broken)
    assert isinstance(info.value.__cause__, KeyError)


def test_a_raising_reward_can_skip_its_group_and_is_counted(tiny_model_dir, tmp_path):
    def broken_on_odd(completion: str, problem: Problem) -> float:
        if int(problem.id.lstrip("t")) % 2:
            raise KeyError("no such field")
        return share_of_a(completion, problem)

    cfg = tiny_config(tiny_model_dir, tmp_path / "run", "train.steps=2", "reward.on_error=skip_group",
                      "eval.problems=4", "eval.samples=2", "eval.before=false")
    result = train(cfg, task=TASK, reward=broken_on_odd)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "reward/error_groups" in m]
    errors = [json.loads(line) for line in (tmp_path / "run" / "reward_errors.jsonl").read_text().splitlines()]
    assert sum(m["reward/error_groups"] for m in steps) == len(errors) > 0
    assert all(int(e["problem_id"]) % 2 == 1 and "KeyError" in e["error"] for e in errors)
    assert result.eval_after["eval/sampled_error_groups"] == 2  # t1 and t3


def test_label_free_run_logs_its_components(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", "train.steps=2", "reward.verifier=majority_vote",
                      "reward.confidence=self_certainty", "reward.confidence_weight=0.5", "reward.format_weight=0",
                      "reward.overlong_buffer=4", "reward.repetition_ngram=2")
    train(cfg, task=TASK)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for key in ("reward/majority", "reward/correct", "reward/confidence", "reward/overlong", "reward/repetition"):
        assert key in metrics[0], key
    assert metrics[0]["reward/confidence"] > 0  # KL(U || p) >= 0, and a random model is not exactly uniform


def test_humaneval_runs_through_the_code_sandbox(tiny_model_dir, tmp_path, monkeypatch):
    from reasonrl.rewards import code

    real_run_many, programs_run = code.run_many, []

    def counting_run_many(programs, **options):
        programs_run.extend(programs)
        return real_run_many(programs, **options)

    monkeypatch.setattr(code, "run_many", counting_run_many)
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", "train.steps=1", "task.name=humaneval", "task.test_size=160",
                      "reward.verifier=code", "reward.format_weight=0", "rollout.prompts_per_step=2",
                      "rollout.group_size=2", "eval.problems=2", "eval.samples=2", "eval.greedy=false")
    train(cfg)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(m for m in metrics if "reward/mean" in m)
    # A random model writes no passing program: every pass rate is 0, and nothing raised.
    assert step["reward/correct"] == 0.0
    assert metrics[-1]["eval/sampled_accuracy"] == 0.0
    assert metrics[-1]["eval/sampled_pass@2"] == 0.0 and metrics[-1]["eval/sampled_maj@2"] == 0.0
    # One harness run per completion: 2 x 2 in the step, 2 x 2 in each of the two evaluations.
    assert len(programs_run) == 4 + 4 + 4
    assert all("check(" in program for program in programs_run)


calls = {"n": 0}


def nan_on_second_step(logp_NT, old_logp_NT, adv_NT, mask_NT):
    calls["n"] += 1
    loss_NT = -adv_NT * logp_NT
    return (loss_NT * float("nan") if calls["n"] > 1 else loss_NT), {}


def test_non_finite_loss_stops_and_keeps_the_last_checkpoint(tiny_model_dir, tmp_path):
    calls["n"] = 0
    run = tmp_path / "run"
    cfg = tiny_config(tiny_model_dir, run, "train.steps=3", "run.save_every=1",
                      f"algo.objective={__name__}:nan_on_second_step", "train.micro_batch_size=32")
    with pytest.raises(NonFiniteLossError, match="weights left unchanged"):
        train(cfg, task=TASK, reward=share_of_a)
    assert [p.name for p in checkpoints(run)] == ["step_000001"]
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_000001" / "policy")


def test_user_data_and_reward_through_the_python_api(tiny_model_dir, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"q": f"spell {i}", "a": "a"}) + "\n" for i in range(10)))
    task = Task.from_records(data, prompt_field="q", answer_field="a", test_size=2)
    result = train(tiny_config(tiny_model_dir, tmp_path / "run", "train.steps=1", "eval.problems=2", "eval.samples=1"),
                   task=task, reward=share_of_a)
    assert result.eval_before is not None and "eval/greedy_reward_mean" in result.eval_before
    rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    training_prompts = {f"spell {i}" for i in range(10)} - {p.prompt for p in task.test}
    assert rollouts and all(any(p in r["prompt"] for p in training_prompts) for r in rollouts)
    assert all(r["reward"] == pytest.approx(share_of_a(r["completion"], None)) for r in rollouts)


def test_missing_model_names_the_model(tmp_path):
    from reasonrl.models import ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="no-such-model"):
        train(load_config(overrides=[f"model.name={tmp_path}/no-such-model", f"run.dir={tmp_path}/run"]),
              task=TASK, reward=share_of_a)


def test_lora_trains_only_adapters_syncs_only_adapters_and_resumes_exactly(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    extra = ("train.lora_rank=4", "train.lora_alpha=8", "train.lr=5e-3", "run.save_every=2")
    train(tiny_config(tiny_model_dir, tmp_path / "straight", "train.steps=4", *extra), task=TASK, reward=share_of_a)
    train(tiny_config(tiny_model_dir, tmp_path / "resumed", "train.steps=2", *extra), task=TASK, reward=share_of_a)
    train(tiny_config(tiny_model_dir, tmp_path / "resumed", "train.steps=4", "run.resume=true", *extra),
          task=TASK, reward=share_of_a)
    adapters = {run: load_file(tmp_path / run / "checkpoints" / "step_000004" / "adapter" / "adapter_model.safetensors")
                for run in ("straight", "resumed")}
    assert adapters["straight"] and all("lora_" in name for name in adapters["straight"])
    for name, tensor in adapters["straight"].items():
        assert torch.equal(tensor, adapters["resumed"][name]), name
    assert any(bool(t.abs().sum()) for n, t in adapters["straight"].items() if "lora_B" in n)  # B starts at 0
    # The exported policy is the base with the adapters merged in: it differs from the base.
    exported = parameters(tmp_path / "straight" / "checkpoints" / "step_000004" / "policy")
    base = parameters(tiny_model_dir)
    assert set(exported) == set(base)
    assert any(not torch.equal(exported[n], base[n]) for n in base)
    assert reward_curve(tmp_path / "straight") == reward_curve(tmp_path / "resumed")


def test_lora_learner_syncs_only_adapters_and_engine_follows(tiny_model_dir):
    from transformers import AutoTokenizer

    from reasonrl.models import with_lora
    from reasonrl.rollout import HFEngine
    from reasonrl.training.learner import Learner, OptimConfig
    from reasonrl.types import SamplingParams

    policy = with_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), rank=4, alpha=8)
    learner = Learner(policy, OptimConfig())
    synced = dict(learner.named_weights())
    assert synced and all("lora_" in name for name in synced)
    assert sum(t.numel() for t in synced.values()) < 0.2 * sum(p.numel() for p in policy.parameters())
    import copy

    engine = HFEngine(copy.deepcopy(policy), AutoTokenizer.from_pretrained(tiny_model_dir))
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=10)
    problems = list(TASK.test)
    before = [g.completions[0].token_ids for g in engine.generate(problems, greedy)]
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.add_(torch.randn_like(param))
    engine.load_weights(learner.named_weights())
    fresh = HFEngine(copy.deepcopy(policy), engine.tokenizer)
    after = [g.completions[0].token_ids for g in engine.generate(problems, greedy)]
    assert after == [g.completions[0].token_ids for g in fresh.generate(problems, greedy)]
    assert after != before


def test_a_reasoning_gym_environment_trains_and_is_scored_by_its_own_checker(tiny_model_dir, tmp_path, monkeypatch):
    pytest.importorskip("reasoning_gym")
    from reasonrl.tasks.environments import ReasoningGymEnvironment

    scored: dict[tuple[str, str], float] = {}  # (problem, completion) -> what a dataset's own checker gave
    checkers: set[str] = set()
    score = ReasoningGymEnvironment.score

    def spied(self, completion, problem):
        checkers.add(self.name)
        scored[problem.id, completion] = score(self, completion, problem)
        return scored[problem.id, completion]

    monkeypatch.setattr(ReasoningGymEnvironment, "score", spied)
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", "train.steps=1", "task.name=environment",
                      "task.environment=basic_arithmetic=1,countdown=1", "task.train_size=8", "task.test_size=2",
                      "reward.format_weight=0", "eval.problems=2", "eval.samples=2", "eval.greedy=false")
    train(cfg)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(m for m in metrics if "reward/mean" in m)
    # Every training completion (4 problems x 8) went through a reasoning-gym dataset's checker, and the
    # logged accuracy is what those checkers gave (the random model solves nothing: at most 0.01 each).
    rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 32 and checkers <= {"basic_arithmetic", "countdown"}
    assert all(r["components"]["correct"] == scored[r["problem_id"], r["completion"]] for r in rollouts)
    assert 0.0 <= step["reward/correct"] <= 0.01 + 1e-9
    assert any(key.startswith("source/") for key in step)  # a mixture: metrics per environment


def test_a_process_reward_model_gives_token_level_rewards(tiny_model_dir, tmp_path):
    # The tiny model doubles as a generative PRM ("+" and "-" are single characters of its tokenizer).
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", "train.steps=1", f"reward.process_model={tiny_model_dir}",
                      "reward.process_split=lines", "reward.process_aggregate=mean", "algo.advantage=reinforce_pp",
                      "reward.format_weight=0", "rollout.max_new_tokens=12")
    train(cfg, task=Task(name="t", train=[Problem(id=str(i), prompt=f"add {i}", answer="1") for i in range(4)],
                         test=[Problem(id="t", prompt="x", answer="1")]))
    lines = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    process = [r["components"]["process"] for r in lines]
    assert all(0.0 < p < 1.0 for p in process if p) and any(process)  # mean step probability of "+"
    metrics = next(m for m in (json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
                   if "reward/process" in m)
    assert 0.0 < metrics["reward/process"] < 1.0


def test_a_token_budget_stops_after_the_step_that_spent_it_and_counts_across_a_resume(tiny_model_dir, tmp_path):
    run = tmp_path / "run"
    result = train(tiny_config(tiny_model_dir, run, "train.steps=10", "train.max_generated_tokens=300"),
                   task=TASK, reward=share_of_a)
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    totals = [m["rollout/generated_tokens_total"] for m in lines if "rollout/generated_tokens_total" in m]
    steps = [m["rollout/generated_tokens"] for m in lines if "rollout/generated_tokens" in m]
    assert totals == [sum(steps[: i + 1]) for i in range(len(steps))]
    assert totals[-1] >= 300 > totals[-2] and result.steps == len(totals) < 10  # at most 256 tokens per step
    assert [c.name for c in checkpoints(run)] == [f"step_{result.steps:06d}"]
    resumed = train(load_config(run / "config.toml", ["run.resume=true", f"train.max_generated_tokens={totals[-1] + 1}"]),
                    task=TASK, reward=share_of_a)
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    after = [m for m in lines if m.get("step") == resumed.steps and "rollout/generated_tokens_total" in m][-1]
    assert resumed.steps == result.steps + 1  # the count went on from the checkpoint's, not from 0
    assert after["rollout/generated_tokens_total"] == totals[-1] + after["rollout/generated_tokens"]


def test_a_time_budget_stops_after_the_step_that_spent_it_and_saves(tiny_model_dir, tmp_path):
    # A budget of a millisecond is spent by the first step: the run stops there, with its checkpoint.
    result = train(tiny_config(tiny_model_dir, tmp_path / "run", "train.steps=5", "train.max_minutes=0.00002"),
                   task=TASK, reward=share_of_a)
    assert result.steps == 1
    assert [c.name for c in checkpoints(tmp_path / "run")] == ["step_000001"]
