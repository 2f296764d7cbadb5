"""Data-parallel learner: two gloo processes on loopback, each updating on its share of the same
batch, end with the gradients and weights of one process updating on the whole batch."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import LlamaConfig, LlamaForCausalLM

from reasonrl.algo.aggregation import seq_mean_token_mean, token_mean
from reasonrl.algo.objectives import ppo_clip
from reasonrl.training.learner import Learner, NonFiniteLossError, OptimConfig, PolicyLoss, make_train_batch
from reasonrl.types import Completion, Group, Problem

AGGREGATIONS = {"token_mean": token_mean, "seq_mean_token_mean": seq_mean_token_mean}
# (epochs, mini_batches): on-policy, and off-policy where old log-probs are computed shard by shard.
SCHEDULES = [(1, 1), (2, 2)]
CASES = [(name, epochs, minis) for name in AGGREGATIONS for epochs, minis in SCHEDULES]
# 7 sequences one per micro-batch in 3 optimizer steps (3, 2, 2 sequences): the ranks are dealt
# different numbers of micro-batches (2 and 1 in the first step, 4 and 3 for the old log-probs).
UNEVEN = ("token_mean", 1, 3, 7, 1)


def tiny_policy() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))


def batch_of_uneven_lengths():
    """8 sequences whose completions have 1..8 tokens: shards of one rank hold far more tokens
    than the other's, so a per-rank normaliser would weigh tokens differently from one process."""
    generator = torch.Generator().manual_seed(1)
    groups = []
    for b in range(2):
        completions = tuple(Completion(token_ids=tuple(torch.randint(1, 32, (1 + (b * 4 + g) * 3 % 8,),
                                                                     generator=generator).tolist()),
                                       text="", logprobs=tuple([-1.0] * (1 + (b * 4 + g) * 3 % 8)),
                                       finish_reason="stop") for g in range(4))
        groups.append(Group(problem=Problem(id=str(b), prompt="x", answer="1"),
                            prompt_ids=tuple(torch.randint(1, 32, (3 + b,), generator=generator).tolist()),
                            completions=completions))
    return make_train_batch(groups, torch.randn(8, generator=generator).tolist(), pad_id=0)


def update(learner_class, aggregation: str, epochs: int, mini_batches: int, sequences: int = 8,
           micro_batch_size: int = 2, **kwargs):
    """Weights, last step's gradients and metrics after one update of a fresh tiny policy."""
    model = tiny_policy()
    # A small clip threshold so that clipping by the (global) gradient norm takes part.
    learner = learner_class(model, OptimConfig(lr=1e-2, grad_clip=0.05), **kwargs)
    batch = batch_of_uneven_lengths().select(torch.arange(sequences))
    metrics = learner.update(batch, PolicyLoss(objective=ppo_clip, aggregation=AGGREGATIONS[aggregation]),
                             epochs=epochs, mini_batches=mini_batches, micro_batch_size=micro_batch_size)
    return ({name: whole(p.detach()).clone() for name, p in model.named_parameters()},
            {name: whole(p.grad).clone() for name, p in model.named_parameters()}, metrics)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor as one process holds it (gathered, when FSDP shards it over the ranks)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def non_finite_update(learner_class) -> tuple[str, bool]:
    """An update where one sequence's advantage is NaN (it lands on one rank only): the error
    raised, and whether the weights were left as they were."""
    model = tiny_policy()
    learner = learner_class(model, OptimConfig(lr=1e-2))
    batch = batch_of_uneven_lengths()
    batch.advantages_NT[0] *= float("nan")
    before = [p.detach().clone() for p in model.parameters()]
    try:
        learner.update(batch, PolicyLoss(objective=ppo_clip, aggregation=token_mean), micro_batch_size=2)
    except NonFiniteLossError as exc:
        return type(exc).__name__, all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    return "no error", False


def sharded_resume() -> dict:
    """FSDP: two updates in a row, and one update, its weights and optimizer state (gathered on
    rank 0, sent to every rank as a checkpoint would be) loaded into a fresh learner, then the
    second; also the share of the weights a rank holds."""
    from reasonrl.distributed import DataParallelLearner

    loss = PolicyLoss(objective=ppo_clip, aggregation=token_mean)

    def learner(weights: dict | None = None) -> DataParallelLearner:
        model = tiny_policy()
        if weights is not None:
            model.load_state_dict(weights)
        return DataParallelLearner(model, OptimConfig(lr=1e-2), shard=True)

    straight = learner()
    for _ in range(2):
        straight.update(batch_of_uneven_lengths(), loss, micro_batch_size=2)
    first = learner()
    first.update(batch_of_uneven_lengths(), loss, micro_batch_size=2)
    weights, box = dict(first.named_weights()), [first.state_dict()]
    dist.broadcast_object_list(box, group_src=0)
    resumed = learner(weights)
    resumed.load_state_dict(box[0])
    resumed.update(batch_of_uneven_lengths(), loss, micro_batch_size=2)
    held = sum(p.to_local().numel() for p in straight.model.parameters())
    return {"straight": dict(straight.named_weights()), "resumed": dict(resumed.named_weights()), "state": box[0],
            "held_fraction": held / sum(p.numel() for p in tiny_policy().parameters())}


def reference_policy() -> LlamaForCausalLM:
    torch.manual_seed(7)
    return LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))


# Packed rows under bfloat16 autocast: another cut of the same rows rounds differently.
CUT = {"autocast_dtype": torch.bfloat16, "pack": True}


def reference_logprobs(scorer) -> torch.Tensor:
    """The reference's log-probs of the uneven batch as an update in 2 mini-batches of micro-batches of 2
    fills them."""
    loss = PolicyLoss(objective=ppo_clip, aggregation=token_mean, kl_coef=0.1)
    batch = scorer.with_reference(batch_of_uneven_lengths(), loss, reference_policy(), micro_batch_size=2,
                                  mini_batches=2, step=3)
    return batch.ref_logp_NT


def run_rank(rank: int, world_size: int, directory: str) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    from reasonrl.distributed import DataParallelLearner, broadcast_batch

    # A short timeout turns a rank left waiting in a collective into an error instead of a hang.
    dist.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    try:
        results: dict = {case: update(DataParallelLearner, *case) for case in CASES}
        results |= {("fsdp", *case): update(DataParallelLearner, *case, shard=True) for case in CASES + [UNEVEN]}
        results["fsdp_resume"] = sharded_resume()
        sent = broadcast_batch(batch_of_uneven_lengths() if rank == 0 else None)
        results["broadcast"] = sent.input_ids_NT
        results["non_finite"] = non_finite_update(DataParallelLearner)
        results["reference"] = reference_logprobs(DataParallelLearner(tiny_policy(), OptimConfig(), **CUT))
        try:
            DataParallelLearner(tiny_policy(), OptimConfig(state="8bit"), shard=True)
            results["sharded_8bit"] = "built"
        except ValueError as exc:
            results["sharded_8bit"] = str(exc)
        torch.save(results, f"{directory}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    directory = tmp_path_factory.mktemp("data-parallel")
    mp.spawn(run_rank, args=(2, str(directory)), nprocs=2, join=True)
    return [torch.load(Path(directory) / f"rank{rank}.pt") for rank in range(2)]


@pytest.mark.parametrize(("case", "sharded"), [(case, False) for case in CASES] + [(case, True) for case in CASES + [UNEVEN]],
                         ids=[f"{a}-epochs{e}-minis{m}" for a, e, m in CASES]
                         + [f"fsdp-{a}-epochs{e}-minis{m}" for a, e, m in CASES] + ["fsdp-uneven-micro-batches"])
def test_two_ranks_update_like_one_process(two_ranks, case, sharded):
    torch.set_num_threads(1)
    weights, grads, metrics = update(Learner, *case)
    for rank, results in enumerate(two_ranks):
        rank_weights, rank_grads, rank_metrics = results[("fsdp", *case) if sharded else case]
        for name in weights:
            torch.testing.assert_close(rank_grads[name], grads[name], atol=1e-7, rtol=1e-5, msg=f"rank {rank} {name}")
            torch.testing.assert_close(rank_weights[name], weights[name], atol=1e-6, rtol=1e-5,
                                       msg=f"rank {rank} {name}")
        # The loss, the global gradient norm and token-weighted metric means are the whole batch's.
        assert rank_metrics.keys() == metrics.keys()
        for key in metrics:
            assert rank_metrics[key] == pytest.approx(metrics[key], rel=1e-5, abs=1e-7), key


def test_the_comparison_would_catch_per_rank_normalisation():
    # What the global normaliser prevents: each rank normalising by its own tokens and the
    # gradients averaged. With token_mean the whole-batch gradient is sum_i g_i / sum_i |y_i|;
    # the average of the shards' means weighs a token of the shorter shard more. Completion
    # lengths are 1, 4, 7, 2 | 5, 8, 3, 6 after prompts of 3 | 4 tokens; dealt every other by
    # sequence length (4, 5, 7, 7, 9, 10, 10, 12), the shards hold 1+4+5+6 = 16 and 2+7+3+8 = 20
    # tokens, so the two gradients disagree.
    torch.set_num_threads(1)
    batch = batch_of_uneven_lengths()
    loss = PolicyLoss(objective=ppo_clip, aggregation=token_mean)
    order = torch.argsort(batch.attention_mask_NT.sum(1), stable=True)
    shard_grads = []
    for shard in (order[0::2], order[1::2]):
        model = tiny_policy()
        Learner(model, OptimConfig(lr=0.0, grad_clip=0.0)).update(batch.select(shard), loss, micro_batch_size=2)
        shard_grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    model = tiny_policy()
    Learner(model, OptimConfig(lr=0.0, grad_clip=0.0)).update(batch, loss, micro_batch_size=2)
    whole = {name: p.grad for name, p in model.named_parameters()}
    averaged = {name: (shard_grads[0][name] + shard_grads[1][name]) / 2 for name in whole}
    assert not all(torch.allclose(averaged[name], whole[name], atol=1e-6, rtol=1e-4) for name in whole)


def test_batch_broadcast_from_rank_zero(two_ranks):
    for results in two_ranks:
        assert torch.equal(results["broadcast"], batch_of_uneven_lengths().input_ids_NT)


def test_a_non_finite_loss_on_one_rank_stops_every_rank_without_a_step(two_ranks):
    # The NaN sequence is in one rank's share; had that rank raised alone, the other would wait
    # forever in the gradient all-reduce and this test would hang instead of passing.
    assert [results["non_finite"] for results in two_ranks] == [("NonFiniteLossError", True)] * 2


def test_fsdp_shards_the_weights_and_resumes_from_its_gathered_state(two_ranks):
    for results in two_ranks:
        resume = results["fsdp_resume"]
        # Each rank holds about half of every weight (dim 0 split in two, rounded up).
        assert 0.45 < resume["held_fraction"] <= 0.55, resume["held_fraction"]
        for name, weight in resume["straight"].items():
            torch.testing.assert_close(resume["resumed"][name], weight, atol=0, rtol=0, msg=name)
    unsharded = Learner(tiny_policy(), OptimConfig(lr=1e-2))
    with pytest.raises(ValueError, match="run.learner_shard=true"):
        unsharded.load_state_dict(two_ranks[0]["fsdp_resume"]["state"])


def test_the_driver_fills_reference_logprobs_as_the_ranks_would(two_ranks):
    """The reference stays in the driver (a RankScorer, no optimizer): it takes the reference's
    log-probs in the micro-batches of each rank's share of each optimizer step, so they equal those
    the two ranks compute together, bit for bit; one process's own cut would not."""
    pytest.importorskip("ray")
    from reasonrl.distributed.ray import RankScorer
    from reasonrl.training.learner import Scorer

    torch.set_num_threads(1)
    ranks = two_ranks[0]["reference"]
    assert torch.equal(two_ranks[1]["reference"], ranks)
    driver = RankScorer(tiny_policy(), world_size=2, **CUT)
    assert torch.equal(reference_logprobs(driver), ranks)
    # The cut is the ranks' (each rank's share of each optimizer step), not one process's.
    from reasonrl.distributed.data_parallel import rank_share

    batch, alone = batch_of_uneven_lengths(), Scorer(tiny_policy(), **CUT)
    parts = alone.mini_batch_split(batch.num_sequences, 2, 3)
    cut = [m.tolist() for part in parts for m in alone.micro_batches(batch, part, 2, pack=False)]
    shared = [m.tolist() for part in parts for r in range(2)
              for m in driver.micro_batches(batch, rank_share(batch, part, r, 2), 2, pack=False)]
    assert sorted(map(sorted, cut)) != sorted(map(sorted, shared))


def test_sharding_refuses_8bit_optimizer_state(two_ranks):
    for rank in two_ranks:
        assert "does not take sharded weights" in rank["sharded_8bit"]
