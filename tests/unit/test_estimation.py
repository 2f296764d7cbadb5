"""Advantage estimation end to end on hand-made groups: the KL penalty in the reward, ReMax's
greedy baseline and token-level returns reach the estimator as the equations say; the critic's
clipped value loss by hand; truncated importance weights scale the learner's gradient."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import group, tiny_policy

from reasonrl.algo.advantages import dr_grpo, reinforce_pp, remax
from reasonrl.algo.aggregation import token_mean
from reasonrl.algo.kl import k1
from reasonrl.algo.objectives import ppo_clip
from reasonrl.algo.value import clipped_value_loss
from reasonrl.training.estimation import AdvantageEstimation
from reasonrl.training.learner import Learner, OptimConfig, PolicyLoss, make_train_batch
from reasonrl.types import Completion, Group, Problem


def scored_group(rewards, lengths=(2, 2)):
    completions = tuple(Completion(token_ids=tuple(range(5, 5 + n)), text="", logprobs=(-1.0,) * n,
                                   finish_reason="stop") for n in lengths)
    return Group(problem=Problem(id="p", prompt="x", answer="1"), prompt_ids=(3,), completions=completions,
                 rewards=tuple(rewards))


class FixedLogprobs:
    """A stand-in learner whose policy and reference log-probs are fixed tensors."""

    def __init__(self, policy_logp, ref_logp):
        self.model, self.ref = object(), object()
        self.by_model = {id(self.model): torch.tensor(policy_logp), id(self.ref): torch.tensor(ref_logp)}

    def logprobs(self, model, batch, micro_batch_size):
        return self.by_model[id(model)]


def test_kl_in_the_reward_is_summed_per_sequence_for_group_estimators():
    # k1 = policy - ref per token: completion 0 [0.5, 0] (sum 0.5), completion 1 [0, -1] (sum -1).
    # With coefficient 0.1 the rewards [1, 0] become [1 - 0.05, 0 + 0.1] = [0.95, 0.1];
    # Dr. GRPO subtracts their mean 0.525 -> [0.425, -0.425] on every completion token.
    learner = FixedLogprobs([[-1.0, -1.0], [-1.0, -2.0]], [[-1.5, -1.0], [-1.0, -1.0]])
    estimate = AdvantageEstimation(dr_grpo, learner, 8, knobs={}, kl_estimator=k1, kl_in_reward=True,
                                   ref_model=learner.ref)
    batch, metrics = estimate([scored_group([1.0, 0.0])], pad_id=0, kl_coef=0.1)
    torch.testing.assert_close(batch.advantages_NT, torch.tensor([[0.425, 0.425], [-0.425, -0.425]]))
    assert metrics["kl/mean"] == pytest.approx((0.5 + 0.0 + 0.0 - 1.0) / 4)
    torch.testing.assert_close(batch.ref_logp_NT, torch.tensor([[-1.5, -1.0], [-1.0, -1.0]]))


def test_kl_in_the_reward_is_per_token_for_token_estimators():
    # Completion 0 has 1 token, completion 1 has 2 (padding after). Token rewards with coefficient 1:
    # completion 0: [1 - 0.5]; completion 1: [0 - 0.2, 0 - 0.1]. gamma 1 returns: [0.5], [-0.3, -0.1];
    # whitened over 3 tokens: mean 0.0333, deviations [0.4667, -0.3333, -0.1333], unbiased variance
    # (0.217778 + 0.111111 + 0.017778) / 2 = 0.173333, std 0.416333 -> [1.120897, -0.800641, -0.320256].
    learner = FixedLogprobs([[-1.0, 0.0], [-1.0, -1.0]], [[-1.5, 0.0], [-1.2, -1.1]])
    estimate = AdvantageEstimation(reinforce_pp, learner, 8, knobs={"gamma": 1.0, "eps": 1e-6}, kl_estimator=k1,
                                   kl_in_reward=True, ref_model=learner.ref)
    batch, _ = estimate([scored_group([1.0, 0.0], lengths=(1, 2))], pad_id=0, kl_coef=1.0)
    torch.testing.assert_close(batch.advantages_NT, torch.tensor([[1.120897, 0.0], [-0.800641, -0.320256]]),
                               atol=1e-5, rtol=0)


def test_remax_s_baseline_is_the_reward_of_one_greedy_completion_a_problem():
    # build_estimation's baseline for the remax recipe: the engine asked for one completion a problem
    # at temperature 0, whatever the rollout's sampling (here a stub that answers right only greedily).
    from reasonrl import load_config
    from reasonrl.build import build_estimation
    from reasonrl.recipes import config_path
    from reasonrl.rewards.compose import WeightedReward
    from reasonrl.types import SamplingParams

    class GreedyOnlyRight:
        def __init__(self):
            self.asked: list[SamplingParams] = []

        def generate(self, problems, sampling):
            self.asked.append(sampling)
            text = "right" if sampling.temperature == 0.0 else "wrong"
            return [Group(problem=p, prompt_ids=(1,), completions=tuple(
                Completion(token_ids=(2,), text=text, logprobs=(0.0,), finish_reason="stop")
                for _ in range(sampling.n))) for p in problems]

    engine = GreedyOnlyRight()
    reward = WeightedReward({"correct": (lambda completion, problem: float(completion == "right"), 1.0)})
    estimate = build_estimation(load_config(config_path("remax")), learner=None, ref_model=None, engine=engine,
                                reward_fn=reward, sampling=SamplingParams(n=8, temperature=1.0))
    problems = [Problem(id=str(i), prompt="q", answer="a") for i in range(2)]
    assert list(estimate.greedy_rewards(problems)) == [1.0, 1.0]
    assert [(s.n, s.temperature) for s in engine.asked] == [(1, 0.0)]


def test_remax_gets_the_reward_of_a_greedy_completion_per_problem():
    asked = []

    def greedy_rewards(problems):
        asked.append([p.id for p in problems])
        return [0.25 for _ in problems]

    estimate = AdvantageEstimation(remax, learner=None, micro_batch_size=8, knobs={"eps": 1e-6}, kl_estimator=k1,
                                   greedy_rewards=greedy_rewards)
    batch, _ = estimate([scored_group([1.0, 0.0])], pad_id=0, kl_coef=0.0)
    assert asked == [["p"]]
    torch.testing.assert_close(batch.advantages_NT, torch.tensor([[0.75, 0.75], [-0.25, -0.25]]))


def test_clipped_value_loss_by_hand():
    # value_clip 0.2:
    #   V 1.0, V_old 0.5, R 2.0: clipped V 0.7; max((1-2)^2, (0.7-2)^2) = 1.69 -> 0.845; the clipped
    #   branch wins and is flat in V: gradient 0.
    #   V 0.6, V_old 0.5, R 2.0: inside, 0.5 * 1.4^2 = 0.98, gradient V - R = -1.4.
    #   V 2.5, V_old 2.0, R 2.2: clipped V 2.2 hits R (loss 0); unclipped 0.3^2 = 0.09 wins -> 0.045,
    #   gradient V - R = 0.3 (an overshoot is always pulled back).
    values = torch.tensor([[1.0, 0.6, 2.5]], requires_grad=True)
    loss, metrics = clipped_value_loss(values, torch.tensor([[0.5, 0.5, 2.0]]), torch.tensor([[2.0, 2.0, 2.2]]),
                                       torch.ones(1, 3), value_clip=0.2)
    torch.testing.assert_close(loss.detach(), torch.tensor([[0.845, 0.98, 0.045]]))
    (grad,) = torch.autograd.grad(loss.sum(), values)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -1.4, 0.3]]))
    assert metrics["value_clip_frac"].item() == pytest.approx(1 / 3)


@pytest.mark.parametrize(("log_gap", "cap", "scale"), [(0.0, 2.0, 1.0), (0.6931472, 1.5, 1.5), (0.6931472, 3.0, 2.0)])
def test_truncated_importance_weights_scale_the_gradient(log_gap, cap, scale):
    # The sampler gave every token log 2 less than the learner: weight min(2, cap) on every token,
    # so the token-mean loss and its gradient scale by that weight.
    def grads(tis_level):
        model = tiny_policy()
        learner = Learner(model, OptimConfig(lr=0.0, grad_clip=0.0))
        generator = torch.Generator().manual_seed(2)
        groups = [group([1, 2, 3], *[torch.randint(1, 32, (4,), generator=generator).tolist() for _ in range(4)])]
        batch = make_train_batch(groups, [1.0, -0.5, 0.25, 2.0], pad_id=0)
        learner_logp = learner.logprobs(model, batch, micro_batch_size=8)
        batch = replace(batch, sampling_logp_NT=(learner_logp - log_gap) * batch.loss_mask_NT)
        loss = PolicyLoss(objective=ppo_clip, aggregation=token_mean, tis_level=tis_level, tis_cap=cap)
        learner.update(batch, loss, micro_batch_size=8)
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    plain, weighted = grads(""), grads("token")
    for name in plain:
        torch.testing.assert_close(weighted[name], plain[name] * scale, atol=1e-6, rtol=1e-4, msg=name)


def test_groups_of_different_sizes_are_estimated_per_group():
    # An adaptive budget gives groups of 2 and 3. Dr. GRPO subtracts each group's own mean:
    # [1, 0] -> mean 0.5 -> [0.5, -0.5]; [1, 1, 0] -> mean 2/3 -> [1/3, 1/3, -2/3]; [0, 2] -> [-1, 1].
    estimate = AdvantageEstimation(dr_grpo, learner=None, micro_batch_size=8, knobs={}, kl_estimator=k1)
    groups = [scored_group([1.0, 0.0]), scored_group([1.0, 1.0, 0.0], lengths=(1, 1, 1)), scored_group([0.0, 2.0])]
    batch, _ = estimate(groups, pad_id=0, kl_coef=0.0)
    per_sequence = batch.advantages_NT.sum(1) / batch.loss_mask_NT.sum(1)
    torch.testing.assert_close(per_sequence, torch.tensor([0.5, -0.5, 1 / 3, 1 / 3, -2 / 3, -1.0, 1.0]))


def test_gdpo_reads_each_reward_component_with_its_weight():
    # Two groups of 2; components correct / format with weights 1 and 0.5. Group 1: correct [1, 0],
    # format [0, 1] -> z-scores [0.7071, -0.7071] and [-0.7071, 0.7071] -> sum [0.3536, -0.3536];
    # group 2: correct [1, 1] (no spread: 0), format [1, 0] -> [0.3536, -0.3536]. Batch-normalised:
    # [1, -1, 1, -1] * 0.3536 / std(0.3536 * [1, -1, 1, -1]) = [0.8660, -0.8660, 0.8660, -0.8660].
    from reasonrl.algo.advantages import gdpo

    def with_components(correct, format_):
        g = scored_group([c + 0.5 * f for c, f in zip(correct, format_)])
        return replace(g, reward_components={"correct": tuple(correct), "format": tuple(format_)})

    estimate = AdvantageEstimation(gdpo, learner=None, micro_batch_size=8, knobs={"eps": 0.0}, kl_estimator=k1,
                                   reward_weights={"correct": 1.0, "format": 0.5})
    batch, _ = estimate([with_components([1.0, 0.0], [0.0, 1.0]), with_components([1.0, 1.0], [1.0, 0.0])],
                        pad_id=0, kl_coef=0.0)
    per_sequence = batch.advantages_NT.sum(1) / batch.loss_mask_NT.sum(1)
    torch.testing.assert_close(per_sequence, torch.tensor([0.8660254, -0.8660254, 0.8660254, -0.8660254]))

    unweighted = replace(estimate, reward_weights={})
    with pytest.raises(ValueError, match="needs the reward's components and their weights"):
        unweighted([with_components([1.0, 0.0], [0.0, 1.0])], pad_id=0, kl_coef=0.0)
    with pytest.raises(ValueError, match="reward components length"):
        replace(estimate, reward_weights={"length": 1.0})([with_components([1.0, 0.0], [0.0, 1.0])], pad_id=0,
                                                          kl_coef=0.0)
