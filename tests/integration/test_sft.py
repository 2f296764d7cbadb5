"""SFT: the loss covers exactly the solution tokens (and EOS), equals the hand-computed mean NLL,
a tiny model learns to write its solutions, and a resumed run continues exactly."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import parameters, sft_config

from reasonrl import Problem, Task
from reasonrl.config import ConfigError
from reasonrl.models import load_model, load_tokenizer
from reasonrl.rollout.hf import HFEngine
from reasonrl.stages.sft import sft_group, sft_update, train_sft
from reasonrl.training.learner import Learner, OptimConfig, make_train_batch
from reasonrl.types import SamplingParams

TASK = Task(name="copy", train=[Problem(id=str(i), prompt=f"q{i}", answer=f"{'ab' * (1 + i % 2)}") for i in range(4)],
            test=[Problem(id="t", prompt="q9", answer="ab")])


def test_loss_mask_covers_the_solution_and_eos_only(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    group = sft_group(tokenizer, Problem(id="p", prompt="hi", answer="abc"), chat_template=True, max_tokens=100)
    # Chat template: "<|user|>hi<eos><|assistant|>" = 5 tokens with the char tokenizer; then a, b, c, <eos>.
    assert len(group.prompt_ids) == 5
    assert tokenizer.decode(group.completions[0].token_ids) == "abc<eos>"
    batch = make_train_batch([group], [1.0], tokenizer.pad_token_id)
    # Position t predicts token t + 1: the 4 targets are predicted from positions 4..7.
    assert batch.loss_mask_NT[0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    cut = sft_group(tokenizer, Problem(id="p", prompt="hi", answer="abcdef"), chat_template=True, max_tokens=2)
    assert tokenizer.decode(cut.completions[0].token_ids) == "ab<eos>"


def test_sft_loss_is_the_mean_nll_of_the_solution_tokens(tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir), dtype=torch.float32, device=torch.device("cpu"))
    groups = [sft_group(tokenizer, p, chat_template=True, max_tokens=100) for p in TASK.train[:2]]
    expected_sum, expected_count = 0.0, 0
    with torch.no_grad():
        for group in groups:
            ids = torch.tensor([list(group.prompt_ids) + list(group.completions[0].token_ids)])
            logp = torch.log_softmax(model(ids).logits[0, :-1], dim=-1)
            targets = ids[0, 1:]
            start = len(group.prompt_ids) - 1
            expected_sum -= logp[start:].gather(1, targets[start:, None]).sum().item()
            expected_count += len(targets) - start
    learner = Learner(model, OptimConfig(lr=0.0), temperature=1.0)
    metrics = sft_update(learner, groups, tokenizer.pad_token_id, micro_batch_size=1)
    # 2 + 1 and 4 + 1 targets: 8 tokens, whatever the micro-batching.
    assert expected_count == 8
    assert abs(metrics["loss/sft"] - expected_sum / expected_count) < 1e-5


def test_a_tiny_model_learns_its_solutions(tiny_model_dir, tmp_path):
    checkpoint = train_sft(sft_config(tiny_model_dir, tmp_path / "run", "train.steps=40"), task=TASK)
    losses = [json.loads(line)["loss/sft"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < 0.2 * losses[0]
    model = load_model(str(checkpoint / "policy"), dtype=torch.float32, device=torch.device("cpu"))
    engine = HFEngine(model, load_tokenizer(str(checkpoint / "policy")))
    greedy = engine.generate(TASK.train, SamplingParams(n=1, temperature=0.0, max_new_tokens=8))
    assert [g.completions[0].text for g in greedy] == [p.answer for p in TASK.train]


def test_sft_resumes_exactly(tiny_model_dir, tmp_path):
    straight = train_sft(sft_config(tiny_model_dir, tmp_path / "straight", "train.steps=4", "sft.batch_size=3"),
                         task=TASK)
    train_sft(sft_config(tiny_model_dir, tmp_path / "resumed", "train.steps=2", "sft.batch_size=3",
                         "run.save_every=2"), task=TASK)
    resumed = train_sft(sft_config(tiny_model_dir, tmp_path / "resumed", "train.steps=4", "sft.batch_size=3",
                                   "run.resume=true"), task=TASK)
    a, b = parameters(straight / "policy"), parameters(resumed / "policy")
    assert all(torch.equal(a[name], b[name]) for name in a)


def stage_runners():
    from helpers import PAIRS, mostly_a

    from reasonrl.stages.preference import train_dpo
    from reasonrl.stages.rft import train_rft

    letters = Task(name="letters", train=[Problem(id=str(i), prompt=f"say {i}", answer="a") for i in range(4)],
                   test=[Problem(id="t", prompt="say t", answer="a")])
    return {"sft": lambda cfg: train_sft(cfg, task=TASK), "dpo": lambda cfg: train_dpo(cfg, task=PAIRS),
            "rft": lambda cfg: train_rft(cfg, task=letters, reward=mostly_a)}


@pytest.mark.parametrize("stage", ["sft", "dpo", "rft"])
def test_a_stage_stops_at_train_max_minutes_with_a_checkpoint_and_resumes_to_the_end(stage, tiny_model_dir,
                                                                                       tmp_path, capsys):
    run = stage_runners()[stage]
    small = ("train.steps=3", "dpo.pairs_per_step=2", "rft.problems_per_round=2", "rft.steps_per_round=1",
             "rollout.group_size=2", "rollout.max_new_tokens=4")
    # A budget far below one step's time: the stage stops after its first step, checkpointed although
    # run.save_every=0 asks for the final one only.
    stopped = run(sft_config(tiny_model_dir, tmp_path / "run", *small, "train.max_minutes=1e-9"))
    assert stopped.name == "step_000001"
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1
    assert "train.max_minutes=1e-09 reached after step 1: stopping here" in capsys.readouterr().out
    finished = run(sft_config(tiny_model_dir, tmp_path / "run", *small, "run.resume=true"))
    assert finished.name == "step_000003"


@pytest.mark.parametrize("stage", ["sft", "dpo", "rft"])
def test_a_stage_refuses_the_generated_token_budget_of_train(stage, tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="train.max_generated_tokens is a budget of `reasonrl train`"):
        stage_runners()[stage](sft_config(tiny_model_dir, tmp_path / "run", "train.max_generated_tokens=100"))


def test_a_stage_prints_its_metrics_every_run_log_every_steps(tiny_model_dir, tmp_path, capsys):
    train_sft(sft_config(tiny_model_dir, tmp_path / "run", "train.steps=4", "run.log_every=2"), task=TASK)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert [line.split(":")[0] for line in printed] == ["step 2", "step 4"]
    assert all("loss/sft=" in line and "perf/step_s=" in line for line in printed)
    train_sft(sft_config(tiny_model_dir, tmp_path / "quiet", "train.steps=2", "run.log_every=0"), task=TASK)
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
