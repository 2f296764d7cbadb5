"""PRIME's implicit process reward (reasonrl.algo.prime, reasonrl.training.prime,
reasonrl.methods.prime): every number derived by hand from the paper's equations (Cui et al. 2025, arXiv 2502.01456), and from the two
defaults that differ from its Eq. 5 (a baseline at the first token only, no process reward on the last token)."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.algo.prime import (
    implicit_prm_loss,
    implicit_process_rewards,
    masked_whiten,
    prime_advantages,
    process_reward_mask,
    sign_accuracy,
)

EQ5 = {"baseline": "token_mean", "reward_last_token": True}  # the paper's equation, on every token

# Two completion tokens with log pi_phi = (-1.0, -2.0) and log pi_ref = (-1.5, -1.0), then padding.
PRM_LOGP = torch.tensor([[-1.0, -2.0, -3.0]])
REF_LOGP = torch.tensor([[-1.5, -1.0, -0.5]])
MASK = torch.tensor([[1.0, 1.0, 0.0]])


def test_implicit_process_reward_is_beta_times_the_log_ratio():
    rewards = implicit_process_rewards(PRM_LOGP, REF_LOGP, MASK, beta=0.05)
    # 0.05 * (-1.0 + 1.5) = 0.025; 0.05 * (-2.0 + 1.0) = -0.05; the padding gets none
    assert rewards[0].tolist() == pytest.approx([0.025, -0.05, 0.0])


def test_ce_loss_and_its_gradient_by_hand():
    prm = PRM_LOGP.clone().requires_grad_(True)
    loss, logits = implicit_prm_loss(prm, REF_LOGP, MASK, torch.tensor([1.0]), beta=1.0)
    # logit = 1 * (0.5 - 1.0) = -0.5; label 1: -log sigmoid(-0.5) = log(1 + e^0.5)
    assert logits.item() == pytest.approx(-0.5)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(0.5)))
    loss.sum().backward()
    # dL/dlogp_t = beta * (sigmoid(logit) - y) on each completion token, 0 on padding
    assert prm.grad[0].tolist() == pytest.approx([1 / (1 + math.exp(0.5)) - 1] * 2 + [0.0])

    prm = PRM_LOGP.clone().requires_grad_(True)
    loss, logits = implicit_prm_loss(prm, REF_LOGP, MASK, torch.tensor([0.0]), beta=0.05)
    # logit = 0.05 * -0.5 = -0.025; label 0: -log(1 - sigmoid(-0.025)) = log(1 + e^-0.025)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-0.025)))
    loss.sum().backward()
    assert prm.grad[0, :2].tolist() == pytest.approx([0.05 / (1 + math.exp(0.025))] * 2)


def test_ce_loss_refuses_labels_outside_zero_one():
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        implicit_prm_loss(PRM_LOGP, REF_LOGP, MASK, torch.tensor([2.0]), beta=0.05)


def test_sign_accuracy_counts_a_zero_reward_as_a_coin_flip():
    logits = torch.tensor([0.3, -0.2, 0.0, 0.1])
    labels = torch.tensor([1.0, 1.0, 0.0, 0.0])
    assert sign_accuracy(logits, labels).tolist() == [1.0, 0.0, 0.5, 0.0]


def test_eq5_advantages_of_a_group_of_two_by_hand():
    # Sample 0: process rewards (0.1, 0.3), outcome 1; sample 1: one token with 0.5, outcome 0.
    process = torch.tensor([[0.1, 0.3], [0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    outcome = torch.tensor([1.0, 0.0])
    advantages = prime_advantages(process, outcome, mask, [2], whiten=False, **EQ5)
    # Process baselines: the other sample's mean per token: 0.5 for sample 0, 0.2 for sample 1.
    # Sample 0: returns of (-0.4, -0.2) = (-0.6, -0.2), plus outcome 1 - 0 = 1 -> (0.4, 0.8).
    # Sample 1: 0.5 - 0.2 = 0.3, plus outcome 0 - 1 = -1 -> -0.7.
    assert advantages.flatten().tolist() == pytest.approx([0.4, 0.8, -0.7, 0.0])
    weighted = prime_advantages(process, outcome, mask, [2], process_weight=2.0, outcome_weight=3.0, whiten=False,
                                **EQ5)
    assert weighted.flatten().tolist() == pytest.approx([2 * -0.6 + 3, 2 * -0.2 + 3, 2 * 0.3 - 3, 0.0])


def test_eq5_leave_one_out_in_a_group_of_three_and_groups_apart():
    process = torch.tensor([[0.2], [0.5], [0.8], [0.0], [1.0]])
    mask = torch.ones(5, 1)
    outcome = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])
    advantages = prime_advantages(process, outcome, mask, [3, 2], whiten=False, **EQ5)
    # Process: 0.2 - (0.5 + 0.8) / 2 = -0.45, 0.5 - 0.5 = 0, 0.8 - 0.35 = 0.45.
    # Outcome: 1 - 0 = 1, 0 - 0.5 = -0.5, 0 - 0.5 = -0.5; the second group: 0 - 1 and 1 - 0, outcomes equal.
    assert advantages[:, 0].tolist() == pytest.approx([0.55, -0.5, -0.05, -1.0, 1.0])


def test_default_advantages_of_a_group_of_two_by_hand():
    # Sample 0: three tokens, process rewards (0.1, 0.3, 0.7), outcome 1; sample 1: two, (0.5, -0.4), outcome 0.
    process = torch.tensor([[0.1, 0.3, 0.7], [0.5, -0.4, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    outcome = torch.tensor([1.0, 0.0])
    advantages = prime_advantages(process, outcome, mask, [2], whiten=False)
    # The last tokens (0.7, -0.4) earn nothing: sequence rewards 0.4 and 0.5. Returns to go: (0.4, 0.3, 0)
    # and (0.5, 0); the baseline, the other's sequence reward, at the first token only: 0.4 - 0.5, 0.5 - 0.4.
    # Plus the outcome's 1 - 0 and 0 - 1.
    assert advantages.tolist() == [pytest.approx([0.9, 1.3, 1.0]), pytest.approx([-0.9, -1.0, 0.0])]


def test_the_first_tokens_process_return_is_rloo_on_the_sequence_rewards():
    generator = torch.Generator().manual_seed(0)
    process = torch.randn(7, 6, generator=generator)
    lengths = torch.tensor([6, 2, 4, 1, 5, 3, 6])
    mask = (torch.arange(6)[None, :] < lengths[:, None]).float()
    returns = prime_advantages(process, torch.zeros(7), mask, [3, 4], whiten=False)
    sequence = (process * process_reward_mask(mask)).sum(dim=1)
    expected = torch.cat([group - (group.sum() - group) / (group.numel() - 1) for group in sequence.split([3, 4])])
    assert torch.allclose(returns[:, 0], expected, atol=1e-6)


@pytest.mark.parametrize("baseline", ["start", "token_mean"])
def test_a_tail_without_process_reward_earns_nothing_only_with_the_start_baseline(baseline):
    # Three wrong answers whose PRM rewards are negative; then the same first answer with 4 more tokens
    # that the PRM gives nothing (a rambling tail). A baseline must not depend on what the sample does
    # after a token: with it, the tail's tokens earn 0 and the tokens before it keep their advantages.
    process = torch.tensor([[-0.2, -0.1, 0.0] + [0.0] * 4, [-0.3, -0.1, 0.0] + [0.0] * 4,
                            [-0.4, -0.2, 0.0] + [0.0] * 4])
    short = torch.tensor([[1.0] * 3 + [0.0] * 4] * 3)
    long = short.clone()
    long[0, 3:] = 1.0
    before = prime_advantages(process, torch.zeros(3), short, [3], whiten=False, baseline=baseline)
    after = prime_advantages(process, torch.zeros(3), long, [3], whiten=False, baseline=baseline)
    if baseline == "start":
        assert after[0, 3:].tolist() == [0.0] * 4 and torch.allclose(after[0, :2], before[0, :2])
    else:
        # Eq. 5: b = mean of the others' per-token rewards, (-0.2 + -0.3) / 2 = -0.25 (the last tokens aside);
        # each rewarded token earns 0.25 more than the PRM gave it, summed to the end: the tail (the last
        # token unrewarded) 0.75, 0.5, 0.25, 0, and the tokens before it 4 * 0.25 more.
        assert after[0, 3:].tolist() == pytest.approx([0.75, 0.5, 0.25, 0.0])
        assert (after[0, :2] - before[0, :2]).tolist() == pytest.approx([1.0, 1.0])


def test_eq5s_baseline_is_a_bonus_per_token():
    # Eq. 5's (|y| - t + 1) * b is the return to go of a reward -b on every token.
    generator = torch.Generator().manual_seed(2)
    process = torch.randn(3, 5, generator=generator) * 0.1
    mask = torch.tensor([[1.0] * 5, [1.0] * 3 + [0.0] * 2, [1.0] * 4 + [0.0]])
    eq5 = prime_advantages(process, torch.zeros(3), mask, [3], whiten=False, **EQ5)
    means = (process * mask).sum(dim=1) / mask.sum(dim=1)
    b = (means.sum() - means) / 2
    bonus = (process - b[:, None]) * mask
    assert torch.allclose(eq5, bonus.flip(1).cumsum(1).flip(1) * mask, atol=1e-6)


def test_the_last_tokens_reward_never_changes_the_default_advantages():
    generator = torch.Generator().manual_seed(1)
    process = torch.randn(4, 5, generator=generator)
    mask = torch.tensor([[1.0] * 5, [1.0] * 3 + [0.0] * 2, [0.0, 1.0, 1.0, 0.0, 0.0], [1.0] + [0.0] * 4])
    outcome = torch.tensor([1.0, 0.0, 0.0, 1.0])
    before = prime_advantages(process, outcome, mask, [2, 2])
    last = [4, 2, 2, 0]
    changed = process.clone()
    changed[torch.arange(4), last] += torch.tensor([5.0, -7.0, 3.0, -2.0])
    assert torch.allclose(prime_advantages(changed, outcome, mask, [2, 2]), before, atol=1e-6)
    # The paper's equation, where it counts, changes them.
    assert not torch.allclose(prime_advantages(changed, outcome, mask, [2, 2], reward_last_token=True), before)


def test_process_reward_mask_drops_each_rows_last_completion_token():
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0], [1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert process_reward_mask(mask).tolist() == [[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0],
                                                  [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    assert process_reward_mask(mask, reward_last_token=True).tolist() == mask.tolist()


def test_whitening_over_the_masked_tokens():
    values = torch.tensor([[0.4, 0.8], [-0.7, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    # mean 1/6, unbiased variance 1.20667 / 2 = 0.60333
    assert masked_whiten(values, mask).flatten().tolist() == pytest.approx([0.3003987, 0.8153681, -1.1157669, 0.0],
                                                                           abs=1e-6)


def test_prime_advantages_refuse_groups_of_one():
    with pytest.raises(ValueError, match="at least 2 samples"):
        prime_advantages(torch.zeros(2, 1), torch.zeros(2), torch.ones(2, 1), [1, 1])
    with pytest.raises(ValueError, match="do not add up"):
        prime_advantages(torch.zeros(2, 1), torch.zeros(2), torch.ones(2, 1), [3])
    with pytest.raises(ValueError, match="unknown process baseline"):
        prime_advantages(torch.zeros(2, 1), torch.zeros(2), torch.ones(2, 1), [2], baseline="mean")


def test_the_prm_is_updated_before_it_scores_the_step(tiny_model_dir):
    # pi_phi starts as pi_ref: scored before its update, every dense reward would be exactly 0.
    from transformers import AutoModelForCausalLM

    from reasonrl.training.learner import OptimConfig
    from reasonrl.training.prime import ImplicitPRM
    from reasonrl.types import TrainBatch

    def start_model():
        return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)

    reference = start_model().eval().requires_grad_(False)
    prm = ImplicitPRM(start_model(), reference, OptimConfig(lr=1e-2), beta=0.05, micro_batch_size=2)
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 9, 0], [5, 7, 7, 7]])
    attention = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    batch = TrainBatch(input_ids_NT=ids, attention_mask_NT=attention, loss_mask_NT=mask,
                       sampling_logp_NT=torch.zeros(3, 3), advantages_NT=torch.zeros(3, 3))
    ref_logp = prm.reference_logprobs(batch)
    assert prm.process_rewards(batch, ref_logp).abs().max() == 0
    metrics = prm.update(batch, torch.tensor([1.0, 0.0, 0.5]), ref_logp, step=0)
    # The untrained PRM's implicit reward is 0: CE log 2 whatever the label, and a coin flip's accuracy.
    assert metrics["prime/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert metrics["prime/accuracy"] == 0.5
    rewards = prm.process_rewards(batch, ref_logp)
    assert rewards[mask.bool()].abs().min() > 0 and rewards[~mask.bool()].abs().max() == 0
    # One step of the CE loss moves the labelled-1 sequence's implicit reward up, the labelled-0 one's down.
    assert rewards[0].sum() > 0 > rewards[1].sum()


def test_the_prm_learns_correctness_not_the_format_bonus():
    # A correct boxed answer earns 1.1 (correct 1 + format 0.1): the PRM's label is the verifier's 1, not
    # the total, which would leave the CE loss's [0, 1]; a reward without a "correct" component is the label.
    from reasonrl.methods.prime import PrimeEstimation, outcome_labels
    from reasonrl.types import Completion, Group, Problem, TrainBatch

    def group(rewards, components):
        completions = tuple(Completion((1,), "x", (0.0,), "stop") for _ in rewards)
        return Group(Problem("p", "1+1", "2"), (0,), completions, rewards=rewards, reward_components=components)

    boxed = group((1.1, 0.0, 1.0), {"correct": (1.0, 0.0, 1.0), "format": (0.1, 0.0, 0.0)})
    custom = group((0.25, 1.0), {})
    assert outcome_labels([boxed, custom]).tolist() == [1.0, 0.0, 1.0, 0.25, 1.0]

    class RecordingPRM:  # the estimation's PRM, reduced to what it is given
        def reference_logprobs(self, batch):
            return torch.zeros(5, 1)

        def update(self, batch, labels_N, ref_logp_NT, step):
            self.labels = labels_N.tolist()
            return {}

        def process_rewards(self, batch, ref_logp_NT):
            return torch.zeros(5, 1)

    batch = TrainBatch(input_ids_NT=torch.ones(5, 2, dtype=torch.long), attention_mask_NT=torch.ones(5, 2),
                       loss_mask_NT=torch.ones(5, 1), sampling_logp_NT=torch.zeros(5, 1),
                       advantages_NT=torch.zeros(5, 1))
    prm = RecordingPRM()
    PrimeEstimation(lambda groups, pad_id, kl: (batch, {}), prm)([boxed, custom], 0, 0.0)
    assert prm.labels == [1.0, 0.0, 1.0, 0.25, 1.0]
