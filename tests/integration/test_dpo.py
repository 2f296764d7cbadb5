"""DPO: the loss against hand-computed values, online pairs from a group's best and worst, and tiny
models that learn the preferred responses (offline) and a verifiable preference (online)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import PAIRS, sft_config

from reasonrl import Problem, Task
from reasonrl.models import load_model, load_tokenizer
from reasonrl.stages.preference import best_and_worst, dpo_loss, sequence_logprobs, train_dpo
from reasonrl.stages.sft import sft_group
from reasonrl.types import Completion, Group


def test_dpo_loss_by_hand():
    # beta 0.5; pair 1: chosen gains 1.0 over the reference, rejected loses 1.0 -> margin 0.5 * 2 = 1.0;
    # pair 2: both unchanged -> margin 0. Loss = mean(-log sigmoid(1), -log sigmoid(0)) = (0.31326 + 0.69315) / 2
    loss, metrics = dpo_loss(torch.tensor([-4.0, -3.0]), torch.tensor([-6.0, -2.0]), torch.tensor([-5.0, -3.0]),
                             torch.tensor([-5.0, -2.0]), beta=0.5)
    expected = (-math.log(1 / (1 + math.exp(-1.0))) + math.log(2.0)) / 2
    assert loss.item() == pytest.approx(expected)
    assert metrics["dpo/chosen_reward"] == pytest.approx((0.5 + 0.0) / 2)
    assert metrics["dpo/rejected_reward"] == pytest.approx((-0.5 + 0.0) / 2)
    assert metrics["dpo/accuracy"] == 0.5  # the tie does not count as ordered


def completion(text):
    return Completion(token_ids=(1,), text=text, logprobs=(0.0,), finish_reason="stop")


def test_online_pairs_are_the_best_and_worst_of_a_group_with_spread():
    group = Group(problem=Problem(id="p", prompt="x", answer="a"), prompt_ids=(0,),
                  completions=tuple(completion(t) for t in "wxyz"), rewards=(0.0, 1.0, 1.0, 0.0))
    chosen, rejected = best_and_worst(group)
    assert (chosen.text, rejected.text) == ("x", "w")  # ties: the earliest
    flat = Group(problem=group.problem, prompt_ids=(0,), completions=group.completions, rewards=(1.0,) * 4)
    assert best_and_worst(flat) is None


def test_offline_dpo_prefers_the_chosen_responses(tiny_model_dir, tmp_path):
    checkpoint = train_dpo(sft_config(tiny_model_dir, tmp_path / "run", "train.steps=15", "dpo.pairs_per_step=4",
                                      "dpo.beta=0.5", "train.lr=5e-3"), task=PAIRS)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["loss/dpo"] < 0.5 * metrics[0]["loss/dpo"]  # starts at log 2 = 0.693
    assert metrics[0]["loss/dpo"] == pytest.approx(math.log(2.0), abs=1e-4)  # policy = reference at step 1
    tokenizer = load_tokenizer(str(tiny_model_dir))
    before = load_model(str(tiny_model_dir), dtype=torch.float32, device=torch.device("cpu"))
    after = load_model(str(checkpoint / "policy"), dtype=torch.float32, device=torch.device("cpu"))
    chosen = [sft_group(tokenizer, p, chat_template=True, max_tokens=16) for p in PAIRS.test]
    with torch.no_grad():
        gain = sequence_logprobs(after, chosen, tokenizer.pad_token_id) - sequence_logprobs(before, chosen,
                                                                                           tokenizer.pad_token_id)
    assert gain.item() > 1.0  # a held-out prompt: the preference generalised, not memorised per prompt


def share_of_a(text: str, problem: Problem) -> float:
    return text.count("a") / len(text) if text else 0.0


def test_online_dpo_raises_a_verifiable_reward(tiny_model_dir, tmp_path):
    task = Task(name="letters", train=[Problem(id=str(i), prompt=f"say {i}", answer="a") for i in range(8)],
                test=[Problem(id="t", prompt="say t", answer="a")])
    train_dpo(sft_config(tiny_model_dir, tmp_path / "run", "train.steps=30", "dpo.online=true",
                         "dpo.pairs_per_step=4", "rollout.group_size=8", "rollout.max_new_tokens=8",
                         "rollout.temperature=1.0", "rollout.dtype=float32", "dpo.beta=0.5", "train.lr=1e-2"),
              task=task, reward=share_of_a)
    rewards = [json.loads(line)["reward/mean"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.5  # 0.02 -> 0.8 at the time of writing
