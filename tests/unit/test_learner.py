"""The learner's batch layout and its invariances: the loss mask covers exactly the completion
tokens, and gradient accumulation over micro-batches equals one pass over the whole batch."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import group, tiny_policy
from transformers import LlamaConfig, LlamaForCausalLM

import reasonrl.training.packing as packing_module
from reasonrl.algo.aggregation import AGGREGATIONS, token_mean
from reasonrl.algo.objectives import OBJECTIVES, ppo_clip
from reasonrl.training.learner import Learner, OptimConfig, PolicyLoss, lr_factor, make_train_batch
from reasonrl.types import Completion, Group, Problem


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


def gradients_after_update(micro_batch_size: int, checkpointing: bool = False, eager_max_scores: int | None = None,
                           loss: PolicyLoss | None = None, stale: bool = False) -> dict[str, torch.Tensor]:
    """The gradient of one update of a tiny model; `stale`: the batch's old log-probs are those of
    the sampler, so that the ratio is not 1."""
    model = tiny_policy()
    model.set_attn_implementation("sdpa")
    if eager_max_scores is not None:
        packing_module.EAGER_ATTENTION_MAX_SCORES = eager_max_scores
    if checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})
    learner = Learner(model, OptimConfig(lr=0.0, grad_clip=0.0))
    generator = torch.Generator().manual_seed(1)
    groups = [group(torch.randint(1, 32, (3 + b,), generator=generator).tolist(),
                    *[torch.randint(1, 32, (1 + (b * 5 + g) % 6,), generator=generator).tolist() for g in range(4)])
              for b in range(2)]
    groups = [replace(g, max_new_tokens=6) for g in groups]  # the generation budget they were sampled under
    batch = make_train_batch(groups, torch.randn(8, generator=generator).tolist(), pad_id=0)
    if stale:
        batch = replace(batch, old_logp_NT=batch.sampling_logp_NT - 3.5)
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
    # seq_mean_token_sum_norm's max_tokens is the batch's generation budget (6)
    loss = PolicyLoss(objective=OBJECTIVES[objective], aggregation=AGGREGATIONS[aggregation], entropy_coef=0.01)
    whole = gradients_after_update(micro_batch_size=8, loss=loss)
    accumulated = gradients_after_update(micro_batch_size=3, loss=loss)
    for name in whole:
        torch.testing.assert_close(accumulated[name], whole[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("objective", ["sapo", "dppo_tv", "dppo_kl", "topr"])
def test_gradient_accumulation_is_exact_for_the_frontier_objectives_off_policy(objective):
    # Stale old log-probs (ratio far from 1): SAPO's gate, DPPO's masks and TOPR's tapering all act.
    loss = PolicyLoss(objective=OBJECTIVES[objective], aggregation=AGGREGATIONS["seq_mean_token_mean"])
    whole = gradients_after_update(micro_batch_size=8, loss=loss, stale=True)
    accumulated = gradients_after_update(micro_batch_size=3, loss=loss, stale=True)
    for name in whole:
        torch.testing.assert_close(accumulated[name], whole[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize(("level", "low"), [("token", 0.05), ("sequence", 1e-6), ("geometric", 0.04)])
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_gradient_accumulation_is_exact_with_masked_importance_sampling(level, low, aggregation):
    # The sampler's log-probs (-0.1, -0.2, ...) against a 32-token model's (about log 1/32): ratios of
    # 0.03-0.06 per token, so each band keeps some tokens or sequences and masks others.
    loss = PolicyLoss(objective=ppo_clip, aggregation=AGGREGATIONS[aggregation], mis_level=level, mis_low=low,
                      mis_high=2.0)
    whole = gradients_after_update(micro_batch_size=8, loss=loss)
    accumulated = gradients_after_update(micro_batch_size=3, loss=loss)
    assert any(g.abs().sum() > 0 for g in whole.values())
    for name in whole:
        torch.testing.assert_close(accumulated[name], whole[name], atol=1e-6, rtol=1e-5, msg=name)


def test_activation_checkpointing_does_not_change_the_gradients():
    plain, recomputed = gradients_after_update(8), gradients_after_update(8, checkpointing=True)
    for name in plain:
        torch.testing.assert_close(recomputed[name], plain[name], atol=1e-6, rtol=1e-5, msg=name)


def test_matmul_and_fused_attention_give_the_same_gradients(monkeypatch):
    monkeypatch.setattr(packing_module, "EAGER_ATTENTION_MAX_SCORES", packing_module.EAGER_ATTENTION_MAX_SCORES)
    fused = gradients_after_update(8, eager_max_scores=0)
    matmul = gradients_after_update(8, eager_max_scores=10**9)
    for name in fused:
        torch.testing.assert_close(matmul[name], fused[name], atol=1e-6, rtol=1e-5, msg=name)


def test_micro_batch_cuts_minimise_padded_positions_by_hand():
    # One chunk of 4 at the longest length costs 4 * 100 + 10 = 410; cutting after the third
    # costs (3 * 12 + 10) + (1 * 100 + 10) = 156, the cheapest of all cuts.
    assert packing_module.cheapest_cuts([10, 11, 12, 100], size=4, overhead=10) == [(0, 3), (3, 4)]
    # A large per-chunk cost keeps them together; `size` still caps a chunk.
    assert packing_module.cheapest_cuts([10, 11, 12, 100], size=4, overhead=1000) == [(0, 4)]
    # With at most 2 per chunk, three chunks: (1,2)(3,4)(9) pads 2*2 + 2*4 + 9 = 21 positions,
    # (1)(2,3)(4,9) would pad 1 + 2*3 + 2*9 = 25.
    assert packing_module.cheapest_cuts([1, 2, 3, 4, 9], size=2, overhead=100) == [(0, 2), (2, 4), (4, 5)]
    assert packing_module.cheapest_cuts([], size=3, overhead=1) == []


def long_groups(vocab: int, seed: int = 1) -> list[Group]:
    """4 prompts of 50-53 tokens, 8 completions each of 10-64 tokens: long enough that under bf16 the
    log-probs of a tiny model depend on how the sequences are packed."""
    generator = torch.Generator().manual_seed(seed)

    def ids(length):
        return torch.randint(1, vocab, (length,), generator=generator).tolist()

    return [group(ids(50 + b), *[ids(10 + (7 * k + b) % 55) for k in range(8)]) for b in range(4)]


def bf16_learner(lr: float = 0.0) -> tuple[Learner, torch.nn.Module]:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256))
    model.set_attn_implementation("sdpa")
    learner = Learner(model, OptimConfig(lr=lr), autocast_dtype=torch.bfloat16, pack=True, micro_batch_positions=2048)
    return learner, model


def test_the_ratio_is_exactly_one_at_the_first_optimizer_step_under_bf16_packing():
    from reasonrl.algo.aggregation import seq_mean_token_mean
    from reasonrl.algo.objectives import gspo

    learner, model = bf16_learner(lr=1e-3)
    batch = make_train_batch(long_groups(256), torch.randn(32, generator=torch.Generator().manual_seed(2)).tolist(),
                             pad_id=0)
    # The premise: packing the whole batch at once gives other bf16 log-probs than packing each
    # optimizer step's sequences, so old log-probs taken the first way would put the ratio off 1.
    mask = batch.loss_mask_NT.bool()
    whole = learner.logprobs(model, batch, 8)
    per_step = learner.logprobs(model, batch, 8, learner.mini_batch_split(32, 4, step=0))
    assert (whole - per_step)[mask].abs().max() > 0
    loss = PolicyLoss(objective=gspo, aggregation=seq_mean_token_mean,
                      objective_kwargs={"clip_low": 3e-4, "clip_high": 4e-4})
    metrics = learner.update(batch, loss, mini_batches=4, micro_batch_size=8)
    first, *later = learner.optimizer_steps
    assert len(later) == 3
    assert first["loss/ratio_mean"] == 1.0 and first["loss/ratio_max"] == 1.0
    assert first["loss/clip_frac"] == 0.0
    # After the first optimizer step the weights moved: the ratio is live, not pinned to 1.
    assert max(step["loss/ratio_max"] for step in later) > 1.0
    assert metrics["loss/ratio_max"] == max(step["loss/ratio_max"] for step in learner.optimizer_steps)


def test_old_logprobs_match_the_update_for_every_split_and_epoch():
    # lr 0: the weights never move, so every optimizer step of every epoch must see ratio 1 exactly,
    # whatever the mini-batch split, micro-batch size or packing.
    batch = make_train_batch(long_groups(256, seed=3), [0.5] * 32, pad_id=0)
    for mini_batches, micro, positions in ((2, 8, 2048), (4, 3, 0), (8, 8, 300)):
        learner, _ = bf16_learner()
        learner.micro_batch_positions = positions
        learner.update(batch, PolicyLoss(objective=ppo_clip, aggregation=token_mean), epochs=2,
                       mini_batches=mini_batches, micro_batch_size=micro)
        assert len(learner.optimizer_steps) == 2 * mini_batches
        assert all(step["loss/ratio_max"] == 1.0 and step["loss/clip_frac"] == 0.0
                   for step in learner.optimizer_steps), (mini_batches, micro, positions)


def test_mini_batches_partition_the_batch_the_same_way_each_time():
    learner = Learner(tiny_policy(), OptimConfig())
    parts = learner.mini_batch_split(10, 3, step=5)
    assert sorted(torch.cat(parts).tolist()) == list(range(10)) and [len(p) for p in parts] == [4, 3, 3]
    assert all(torch.equal(a, b) for a, b in zip(parts, learner.mini_batch_split(10, 3, step=5)))
    assert not all(torch.equal(a, b) for a, b in zip(parts, learner.mini_batch_split(10, 3, step=6)))
    assert torch.equal(learner.mini_batch_split(10, 1, step=5)[0], torch.arange(10))


COV_LOSSES = {
    "clip_cov": {"clip_cov_ratio": 0.3, "cov_low": -10.0, "cov_high": 10.0},
    "kl_cov": {"kl_cov_ratio": 0.3, "kl_cov_coef": 1.0},
}


def cov_loss(name: str, **overrides) -> PolicyLoss:
    from reasonrl.algo.objectives import TOKEN_SELECTIONS
    from reasonrl.spec import spec_of

    knobs = COV_LOSSES[name] | overrides
    selection = TOKEN_SELECTIONS[name]
    return PolicyLoss(objective=OBJECTIVES[name], aggregation=token_mean, objective_kwargs=knobs,
                      token_selection=selection,
                      selection_kwargs={key: value for key, value in knobs.items() if key in spec_of(selection).knobs})


@pytest.mark.parametrize("name", sorted(COV_LOSSES))
def test_covariance_token_choice_does_not_depend_on_the_micro_batch_size(name):
    # The tokens are chosen over the optimizer step's whole batch: micro-batches of 1 and of 8
    # detach (or penalise) the same tokens, so the gradients are equal.
    whole = gradients_after_update(micro_batch_size=8, loss=cov_loss(name), stale=True)
    single = gradients_after_update(micro_batch_size=1, loss=cov_loss(name), stale=True)
    for parameter in whole:
        torch.testing.assert_close(single[parameter], whole[parameter], atol=1e-6, rtol=1e-5, msg=parameter)


@pytest.mark.parametrize("name, ratio", [("clip_cov", 0.3), ("kl_cov", 0.3), ("clip_cov", 1e-4), ("kl_cov", 1e-4)])
def test_covariance_count_is_a_share_of_the_optimizer_steps_tokens(name, ratio):
    # max(int(ratio * tokens), 1) tokens per optimizer step, over all of its micro-batches (a
    # per-micro-batch count would give one token per micro-batch at a small ratio).
    model = tiny_policy()
    learner = Learner(model, OptimConfig(lr=0.0))
    generator = torch.Generator().manual_seed(1)
    groups = [group(torch.randint(1, 32, (3,), generator=generator).tolist(),
                    *[torch.randint(1, 32, (4 + (b + g) % 5,), generator=generator).tolist() for g in range(4)])
              for b in range(4)]
    batch = make_train_batch(groups, torch.randn(16, generator=generator).tolist(), pad_id=0)
    ratio_key = "clip_cov_ratio" if name == "clip_cov" else "kl_cov_ratio"
    learner.update(batch, cov_loss(name, **{ratio_key: ratio}), mini_batches=2, micro_batch_size=2)
    parts = learner.mini_batch_split(16, 2, step=0)
    frac_key = "loss/cov_detached_frac" if name == "clip_cov" else "loss/cov_penalised_frac"
    for part, metrics in zip(parts, learner.optimizer_steps):
        tokens = float(batch.loss_mask_NT[part].sum())
        assert round(metrics[frac_key] * tokens) == max(int(ratio * tokens), 1)


@pytest.mark.parametrize(("schedule", "expected"), [
    # warm-up of 2 optimizer steps, then the decay over the remaining 8 of a 10-step run (by hand:
    # linear 1 - (s - 2) / 8; cosine (1 + cos(pi (s - 2) / 8)) / 2, e.g. s = 4: (1 + cos(pi / 4)) / 2)
    ("constant", [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
    ("linear", [0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0.0]),
    ("cosine", [0.5, 1.0, 1.0, 0.9619398, 0.8535534, 0.6913417, 0.5, 0.3086583, 0.1464466, 0.0380602, 0.0]),
])
def test_learning_rate_schedules_by_hand(schedule, expected):
    factor = lr_factor(OptimConfig(warmup_steps=2, schedule=schedule, decay_horizon=10))
    assert [factor(s) for s in range(11)] == pytest.approx(expected, abs=1e-7)
    assert factor(50) == expected[-1]  # steps past the horizon (a resume with more steps) stay at the end


def test_the_loss_is_normalised_over_the_loss_tokens_not_the_padded_positions():
    # On policy, ppo_clip's token loss is -A: token_mean over 3 + 1 completion tokens is
    # (-1 x 3 + 1 x 1) / 4 = -0.5, in one micro-batch or two; over the 8 attended positions it would be -0.25.
    for micro_batch_size in (2, 1):
        learner = Learner(tiny_policy(), OptimConfig(lr=0.0, grad_clip=0.0))
        batch = make_train_batch([group((1, 2), (3, 4, 5), (6,))], [1.0, -1.0], pad_id=0)
        metrics = learner.update(batch, PolicyLoss(objective=ppo_clip, aggregation=token_mean),
                                 micro_batch_size=micro_batch_size)
        assert metrics["loss/policy"] == -0.5


def test_the_learner_steps_the_schedule_once_per_optimizer_step():
    # 2 epochs x 2 mini-batches = 4 optimizer steps per update; linear decay over 8: lr 0.1 (1 - s / 8).
    model = tiny_policy()
    learner = Learner(model, OptimConfig(lr=0.1, schedule="linear", decay_horizon=8))
    stepped_at = []
    step = learner.optimizer.step
    learner.optimizer.step = lambda *args, **kwargs: (stepped_at.append(learner.optimizer.param_groups[0]["lr"]),
                                                      step(*args, **kwargs))[1]
    batch = make_train_batch(long_groups(vocab=model.config.vocab_size), [0.5, -0.5] * 16, pad_id=0)
    for update in range(2):
        learner.update(batch, PolicyLoss(objective=ppo_clip, aggregation=token_mean), epochs=2, mini_batches=2,
                       micro_batch_size=8, step=update)
    assert learner.scheduler.last_epoch == 8
    assert stepped_at == pytest.approx([0.1, 0.0875, 0.075, 0.0625, 0.05, 0.0375, 0.025, 0.0125])


@pytest.mark.parametrize(("positions", "kept", "releases"),
                         [(16, True, 32), (100, True, 9), (400, True, 0), (4096, True, 0), (16, False, 0)])
def test_a_long_micro_batch_hands_its_freed_memory_back_after_backward(monkeypatch, positions, kept, releases):
    import reasonrl.training.learner as learner_module

    calls = []
    monkeypatch.setattr(learner_module, "keeps_freed_memory", lambda: kept)
    monkeypatch.setattr(learner_module, "release_freed_memory", lambda: calls.append(1) or True)
    model = tiny_policy()
    learner = Learner(model, OptimConfig(), pack=True, micro_batch_positions=positions)
    groups = long_groups(vocab=model.config.vocab_size)
    batch = make_train_batch(groups, [0.5, -0.5] * 16, pad_id=0)
    learner.update(batch, PolicyLoss(objective=ppo_clip, aggregation=token_mean), micro_batch_size=8)
    # Every sequence (60-117 positions) is longer than 16, so each is a micro-batch of its own, and
    # each hands its memory back once the allocator is keeping it. At 100 the 9 sequences past 100
    # positions do (50 + b + 10 + (7k + b) % 55 > 100 for 9 of the 32); the rest share packed
    # micro-batches, whose padded N x T exceeds 100 but whose sequences do not, and keep it. At 400
    # and 4096 none does.
    assert len(calls) == releases
