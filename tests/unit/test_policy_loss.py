"""PolicyLoss's penalty terms by hand (reasonrl.algo.loss): the KL to the reference pulls the policy
towards it, the entropy bonus pushes the entropy up, whatever the objective gives beside them."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.algo.aggregation import token_mean
from reasonrl.algo.kl import k3
from reasonrl.algo.loss import PolicyLoss
from reasonrl.algo.objectives import reinforce
from reasonrl.types import TrainBatch


def one_row(logp_NT: torch.Tensor, ref_logp_NT: torch.Tensor) -> TrainBatch:
    """A batch of one sequence of two tokens with zero advantages: only the penalties are left."""
    ones = torch.ones_like(logp_NT)
    return TrainBatch(input_ids_NT=torch.zeros(1, 3, dtype=torch.long), attention_mask_NT=torch.ones(1, 3),
                      loss_mask_NT=ones, sampling_logp_NT=logp_NT.detach(), advantages_NT=torch.zeros_like(logp_NT),
                      ref_logp_NT=ref_logp_NT)


def test_the_kl_term_is_added_and_its_gradient_pulls_the_policy_to_the_reference():
    # d = ref - logp = [-1, +1]; k3 = e^d - d - 1 = [e^-1, e - 2]; the loss 0.5 k3 = [0.18394, 0.35914];
    # d(0.5 k3)/d logp = 0.5 (1 - e^d) = [0.31606, -0.85914]: descent lowers logp where the policy is
    # above the reference (token 0) and raises it where it is below (token 1).
    logp_NT = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    batch = one_row(logp_NT, torch.tensor([[-2.0, -1.0]]))
    loss = PolicyLoss(objective=reinforce, aggregation=token_mean, kl_estimator=k3, kl_coef=0.5)
    loss_NT, metrics = loss.token_losses(logp_NT, torch.zeros(1, 2), batch, torch.Generator())
    assert loss_NT.detach().tolist()[0] == pytest.approx([0.5 * math.exp(-1), 0.5 * (math.e - 2)], abs=1e-6)
    assert metrics["kl/mean"].item() == pytest.approx((math.exp(-1) + math.e - 2) / 2, abs=1e-6)
    loss_NT.sum().backward()
    assert logp_NT.grad.tolist()[0] == pytest.approx([0.5 * (1 - math.exp(-1)), 0.5 * (1 - math.e)], abs=1e-6)


def test_the_entropy_bonus_is_subtracted_so_that_descent_raises_the_entropy():
    logp_NT = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    entropy_NT = torch.tensor([[0.7, 1.3]], requires_grad=True)
    loss = PolicyLoss(objective=reinforce, aggregation=token_mean, entropy_coef=0.5)
    loss_NT, _ = loss.token_losses(logp_NT, entropy_NT, one_row(logp_NT, torch.zeros(1, 2)), torch.Generator())
    assert loss_NT.detach().tolist()[0] == pytest.approx([-0.35, -0.65], abs=1e-6)
    loss_NT.sum().backward()
    assert entropy_NT.grad.tolist()[0] == pytest.approx([-0.5, -0.5])
