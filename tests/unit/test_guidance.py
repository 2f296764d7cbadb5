"""Supervised guidance: the per-token losses and their gradients by hand, the weight schedules,
which problems get a target, the auxiliary gradient adding to the RL gradient, and the state
round trip."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from reasonrl.algo.aggregation import token_mean
from reasonrl.algo.guidance import guidance_objective, guidance_weight
from reasonrl.algo.objectives import ppo_clip
from reasonrl.config import GuidanceConfig
from reasonrl.methods.guidance import Guidance
from reasonrl.training.learner import Learner, OptimConfig, PolicyLoss, make_train_batch
from reasonrl.types import Completion, Group, Problem


def loss_and_gradient(weighting: str, p: float, advantage: float = 1.0, gamma: float = 0.1) -> tuple[float, float]:
    logp_NT = torch.tensor([[math.log(p)]], requires_grad=True)
    loss_NT, _ = guidance_objective(logp_NT, logp_NT.detach(), torch.tensor([[advantage]]), torch.ones(1, 1),
                                    weighting=weighting, gamma=gamma)
    loss_NT.sum().backward()
    return loss_NT.item(), logp_NT.grad.item()


def test_token_losses_and_gradients_by_hand():
    # nll: -log p; d/dlog p = -1.  At p = 0.5: 0.693147.
    assert loss_and_gradient("nll", 0.5) == pytest.approx((0.693147, -1.0), abs=1e-6)
    # CHORD-phi: -sg(p(1-p)) log p; at p = 0.5 the weight is 0.25: loss 0.173287, gradient -0.25;
    # at p = 0.9 the weight is 0.09: a token the policy already predicts barely moves.
    assert loss_and_gradient("phi", 0.5) == pytest.approx((0.173287, -0.25), abs=1e-6)
    assert loss_and_gradient("phi", 0.9)[1] == pytest.approx(-0.09, abs=1e-6)
    # LUFFY shaping: -p/(p+gamma); d/dlog p = -gamma p / (p + gamma)^2.
    # p = 0.5, gamma = 0.1: loss -0.833333, gradient -0.05 / 0.36 = -0.138889.
    assert loss_and_gradient("shaped", 0.5) == pytest.approx((-0.833333, -0.138889), abs=1e-6)
    # p = 0.01: -0.001 / 0.0121 = -0.082645 - a rare token gets more push per unit of p than nll's
    # p-gradient would give it relative to its size.
    assert loss_and_gradient("shaped", 0.01)[1] == pytest.approx(-0.082645, abs=1e-6)
    # The advantage slot carries the guidance weight: it scales loss and gradient.
    assert loss_and_gradient("nll", 0.5, advantage=0.3) == pytest.approx((0.207944, -0.3), abs=1e-6)
    with pytest.raises(ValueError, match="weighting 'kl'"):
        loss_and_gradient("kl", 0.5)


def test_weight_schedules_by_hand():
    assert guidance_weight(7, 0.3, "constant", 10) == 0.3
    assert guidance_weight(5, 0.3, "linear", 10) == pytest.approx(0.15)
    assert guidance_weight(0, 0.3, "cosine", 10) == pytest.approx(0.3)
    assert guidance_weight(5, 0.3, "cosine", 10) == pytest.approx(0.15)  # 0.3 * (1 + cos(pi/2)) / 2
    assert guidance_weight(10, 0.3, "cosine", 10) == pytest.approx(0.0, abs=1e-12)
    assert guidance_weight(25, 0.3, "linear", 10) == 0.0  # stays at 0 after the decay
    with pytest.raises(ValueError, match="schedule 'step'"):
        guidance_weight(0, 0.3, "step", 10)


class CharTokenizer:
    eos_token_id = 3

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [4 + (ord(ch) % 20) for ch in text]}


def scored_group(problem: Problem, correct: list[int]) -> Group:
    completions = tuple(Completion(token_ids=(5 + g,), text=str(g), logprobs=(-1.0,), finish_reason="stop")
                        for g in range(len(correct)))
    return Group(problem=problem, prompt_ids=(9, 9), completions=completions, rewards=tuple(map(float, correct)),
                 reward_components={"correct": tuple(map(float, correct))})


PROBLEMS = [Problem(id=str(i), prompt="q", answer="1", metadata={"solution": "ab"}) for i in range(3)]


def guidance(**settings) -> Guidance:
    return Guidance(GuidanceConfig(**{"mode": "mixed", **settings}), steps=10, tokenizer=CharTokenizer(),
                    chat_template=False, pad_id=0)


def test_only_failed_groups_get_the_expert_solution_as_target():
    guide = guidance(weight=0.5)
    guide.observe([0, 1, 2], [scored_group(PROBLEMS[0], [0, 0]), scored_group(PROBLEMS[1], [1, 0]),
                              scored_group(PROBLEMS[2], [0, 0])], step=0)
    batch, _ = guide.auxiliary(step=0)
    # Problems 0 and 2 failed: their prompt (9, 9) then "ab" -> 4 + 97 % 20 = 21, 4 + 98 % 20 = 22, then EOS 3.
    assert batch.input_ids_NT.tolist() == [[9, 9, 21, 22, 3]] * 2
    assert batch.loss_mask_NT.tolist() == [[0, 1, 1, 1]] * 2
    assert batch.advantages_NT.tolist() == [[0, 0.5, 0.5, 0.5]] * 2  # the weight mu on every target token
    assert guide.auxiliary(step=1) is None  # the queue was emptied
    assert guide.metrics(1)["guidance/targets"] == 2
    everything = guidance(on="all")
    everything.observe([1], [scored_group(PROBLEMS[1], [1, 1])], step=0)
    assert everything.auxiliary(step=0)[0].num_sequences == 1


def test_replayed_solutions_are_the_policys_own_earlier_correct_samples():
    guide = guidance(source="replay")
    guide.observe([0], [scored_group(PROBLEMS[0], [0, 0])], step=0)
    assert guide.auxiliary(step=0) is None  # nothing solved before: nothing to replay
    guide.observe([0], [scored_group(PROBLEMS[0], [0, 1])], step=1)  # completion 1 (token 6) is correct
    guide.observe([0], [scored_group(PROBLEMS[0], [0, 0])], step=2)
    batch, _ = guide.auxiliary(step=2)
    assert batch.input_ids_NT.tolist() == [[9, 9, 6]]


def test_interleave_trains_every_k_steps_on_what_it_collected():
    guide = guidance(mode="interleave", every=2)
    guide.observe([0], [scored_group(PROBLEMS[0], [0, 0])], step=0)
    assert guide.auxiliary(step=0) is None and guide.interleaved(step=1) is None
    guide.observe([2], [scored_group(PROBLEMS[2], [0, 0])], step=1)
    batch, _ = guide.interleaved(step=2)
    assert batch.num_sequences == 2 and batch.advantages_NT.max() == 1.0
    assert guide.interleaved(step=4) is None


def test_state_round_trips():
    guide = guidance(mode="interleave", source="replay")
    guide.observe([0], [scored_group(PROBLEMS[0], [1, 0])], step=0)
    guide.observe([0], [scored_group(PROBLEMS[0], [0, 0])], step=1)
    restored = guidance(mode="interleave", source="replay")
    restored.load_state_dict(guide.state_dict())
    assert restored.pending == guide.pending and restored.replay.stored == guide.replay.stored


def test_bad_settings_and_solutions_fail_clearly():
    with pytest.raises(ValueError, match="guidance.source='teacher'"):
        guidance(source="teacher")
    broken = guidance()
    with pytest.raises(ValueError, match=r"metadata\['solution'\] must be a non-empty string"):
        broken.observe([0], [scored_group(Problem(id="x", prompt="q", answer="1", metadata={"solution": ""}), [0])], 0)


def tiny_policy() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))


def gradients(batch, loss, auxiliary=None, micro_batch_size=8):
    model = tiny_policy()
    learner = Learner(model, OptimConfig(lr=0.0, grad_clip=0.0))
    metrics = learner.update(batch, loss, micro_batch_size=micro_batch_size, auxiliary=auxiliary)
    return {name: p.grad.clone() for name, p in model.named_parameters()}, metrics


def test_the_auxiliary_gradient_adds_to_the_rl_gradient():
    generator = torch.Generator().manual_seed(0)
    rl_groups = [Group(problem=PROBLEMS[0], prompt_ids=(1, 2, 3), completions=tuple(
        Completion(token_ids=tuple(torch.randint(4, 32, (n,), generator=generator).tolist()), text="",
                   logprobs=(-1.0,) * n, finish_reason="stop") for n in (2, 5, 3)))]
    rl_batch = make_train_batch(rl_groups, [1.0, -0.5, 0.2], pad_id=0)
    rl_loss = PolicyLoss(objective=ppo_clip, aggregation=token_mean)
    guide = guidance(weight=0.4, weighting="phi")
    guide.observe([0], [scored_group(PROBLEMS[0], [0, 0])], step=0)
    auxiliary = guide.auxiliary(step=0)
    rl_only, _ = gradients(rl_batch, rl_loss)
    auxiliary_only, _ = gradients(*auxiliary)
    both, metrics = gradients(rl_batch, rl_loss, auxiliary=auxiliary, micro_batch_size=2)
    assert "loss/auxiliary" in metrics
    for name in both:
        torch.testing.assert_close(both[name], rl_only[name] + auxiliary_only[name], atol=1e-6, rtol=1e-5, msg=name)
    assert any(auxiliary_only[name].abs().sum() > 0 for name in auxiliary_only)
