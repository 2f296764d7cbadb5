"""The learner's batch layout and its invariances: the loss mask covers exactly the completion
tokens, and gradient accumulation over micro-batches equals one pass over the whole batch."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import reasonrl.learner as learner_module
from reasonrl.algo.aggregation import AGGREGATIONS, token_mean
from reasonrl.algo.objectives import OBJECTIVES, ppo_clip
from reasonrl.learner import Learner, OptimConfig, PolicyLoss, make_train_batch
from reasonrl.types import Completion, Group, Problem


def group(prompt_ids, *completions):
    return Group(problem=Problem(id="p", prompt="x", answer="1"), prompt_ids=tuple(prompt_ids),
                 completions=tuple(Completion(token_ids=tuple(ids), text="", logprobs=tuple(-0.1 * (i + 1) for i in range(len(ids))),
                                              finish_reason="stop") for ids in completions))


def test_train_batch_layout_by_hand():
    batch = make_train_batch([group([5, 6, 7], [8, 9], [10]), group([11], [12, 13, 14])], [1.0, -1.0, 0.5], pad_id=0)
    assert batch.input_ids_NT.tolist() == [[5, 6, 7, 8, 9], [5, 6, 7, 10, 0], [11, 12, 13, 14, 0]]
    assert batch.attention_mask_NT.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 1, 0]]
    # Position t predicts token t+1: completion tokens 8, 9 are predicted at positions 2, 3.
    assert batch.loss_mask_NT.tolist() == [[0, 0, 1, 1], [0, 0, 1, 0], [1, 1, 1, 0]]
    torch.testing.assert_close(batch.sampling_logp_NT[0], torch.tensor([0, 0, -0.1, -0.2]))
    torch.testing.assert_close(batch.sampling_logp_NT[2], torch.tensor([-0.1, -0.2, -0.3, 0]))
    # each sample's advantage on its completion tokens
    assert batch.advantages_NT.tolist() == [[0, 0, 1, 1], [0, 0, -1, 0], [0.5, 0.5, 0.5, 0]]


def test_tokens_the_environment_inserted_get_no_loss():
    # A two-turn episode after prompt [5, 6]: the model wrote 7, 8, the environment inserted 9,
    # the model wrote 10. Positions 1..4 predict 7, 8, 9, 10; position 3 (predicting 9) is masked.
    episode = Completion(token_ids=(7, 8, 9, 10), text="", logprobs=(-0.1, -0.2, 0.0, -0.4), finish_reason="stop",
                         loss_mask=(1, 1, 0, 1))
    batch = make_train_batch([Group(problem=Problem(id="p", prompt="x", answer="1"), prompt_ids=(5, 6),
                                    completions=(episode,))], [2.0], pad_id=0)
    assert batch.loss_mask_NT.tolist() == [[0, 1, 1, 0, 1]]
    assert batch.advantages_NT.tolist() == [[0, 2, 2, 0, 2]]


def tiny_policy(seed=0):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))


def gradients_after_update(micro_batch_size: int, checkpointing: bool = False, eager_max_scores: int | None = None,
                           loss: PolicyLoss | None = None) -> dict[str, torch.Tensor]:
    model = tiny_policy()
    model.set_attn_implementation("sdpa")
    if eager_max_scores is not None:
        learner_module.EAGER_ATTENTION_MAX_SCORES = eager_max_scores
    if checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})
    learner = Learner(model, OptimConfig(lr=0.0, grad_clip=0.0))
    generator = torch.Generator().manual_seed(1)
    groups = [group(torch.randint(1, 32, (3 + b,), generator=generator).tolist(),
                    *[torch.randint(1, 32, (1 + (b * 5 + g) % 6,), generator=generator).tolist() for g in range(4)])
              for b in range(2)]
    batch = make_train_batch(groups, torch.randn(8, generator=generator).tolist(), pad_id=0)
    learner.update(batch, loss or PolicyLoss(objective=ppo_clip, aggregation=token_mean),
                   micro_batch_size=micro_batch_size)
    assert model.config._attn_implementation == "sdpa"  # restored after the update
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def test_gradient_accumulation_equals_one_full_batch():
    whole = gradients_after_update(micro_batch_size=8)
    for split in (1, 3):
        accumulated = gradients_after_update(micro_batch_size=split)
        for name in whole:
            torch.testing.assert_close(accumulated[name], whole[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS))
@pytest.mark.parametrize("objective", ["ppo_clip", "gspo", "gmpo", "cispo"])
def test_gradient_accumulation_is_exact_for_every_aggregation(objective, aggregation):
    extra = {"max_tokens": 6} if aggregation == "seq_mean_token_sum_norm" else {}
    loss = PolicyLoss(objective=OBJECTIVES[objective], aggregation=AGGREGATIONS[aggregation], aggregation_kwargs=extra,
                      entropy_coef=0.01)
    whole = gradients_after_update(micro_batch_size=8, loss=loss)
    accumulated = gradients_after_update(micro_batch_size=3, loss=loss)
    for name in whole:
        torch.testing.assert_close(accumulated[name], whole[name], atol=1e-6, rtol=1e-5, msg=name)


def test_activation_checkpointing_does_not_change_the_gradients():
    plain, recomputed = gradients_after_update(8), gradients_after_update(8, checkpointing=True)
    for name in plain:
        torch.testing.assert_close(recomputed[name], plain[name], atol=1e-6, rtol=1e-5, msg=name)


def test_matmul_and_fused_attention_give_the_same_gradients(monkeypatch):
    monkeypatch.setattr(learner_module, "EAGER_ATTENTION_MAX_SCORES", learner_module.EAGER_ATTENTION_MAX_SCORES)
    fused = gradients_after_update(8, eager_max_scores=0)
    matmul = gradients_after_update(8, eager_max_scores=10**9)
    for name in fused:
        torch.testing.assert_close(matmul[name], fused[name], atol=1e-6, rtol=1e-5, msg=name)


def test_micro_batch_cuts_minimise_padded_positions_by_hand():
    # One chunk of 4 at the longest length costs 4 * 100 + 10 = 410; cutting after the third
    # costs (3 * 12 + 10) + (1 * 100 + 10) = 156, the cheapest of all cuts.
    assert learner_module.cheapest_cuts([10, 11, 12, 100], size=4, overhead=10) == [(0, 3), (3, 4)]
    # A large per-chunk cost keeps them together; `size` still caps a chunk.
    assert learner_module.cheapest_cuts([10, 11, 12, 100], size=4, overhead=1000) == [(0, 4)]
    # With at most 2 per chunk, three chunks: (1,2)(3,4)(9) pads 2*2 + 2*4 + 9 = 21 positions,
    # (1)(2,3)(4,9) would pad 1 + 2*3 + 2*9 = 25.
    assert learner_module.cheapest_cuts([1, 2, 3, 4, 9], size=2, overhead=100) == [(0, 2), (2, 4), (4, 5)]
    assert learner_module.cheapest_cuts([], size=3, overhead=1) == []
