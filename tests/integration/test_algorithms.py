"""Each algorithm family learns end to end on a tiny random model, and the stateful parts it adds
(critic, adaptive KL coefficient, reset reference) resume exactly.

Families: group-relative baselines (RLOO, Dr. GRPO with its constant normaliser, ReMax's greedy
baseline, OPO, REINFORCE++-baseline, batch-std GRPO), sequence-level ratios (GSPO, GMPO), other
per-token objectives (CISPO, Clip-Cov, KL-Cov, dual-clip), token-level returns (REINFORCE++
with the KL in the reward), the critic (PPO with GAE), and the 2025-2026 additions (SAPO, DPPO's
two trust regions, TOPR on one-step-stale samples, GDPO, MaxRL, LUSPO, masked importance
sampling on stale samples), and groups sampled as trees with TreeRL's segment advantages. The
reward is the share of the letter 'a' in the completion; a sign error anywhere in an estimator
or objective makes it fall.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import TASK, parameters, reward_curve, share_of_a, tiny_config, train_straight_and_resumed

from reasonrl import train
from reasonrl.spec import declare
from reasonrl.training.checkpoint import load_trainer_state

FAMILIES = {
    "rloo": ["algo.advantage=rloo"],
    "dr_grpo": ["algo.advantage=dr_grpo", "algo.aggregation=seq_mean_token_sum_norm"],
    # ReMax's r - r(greedy) is not divided by a std: at this reward's scale (1/8 per 'a') its steps are
    # ~10x smaller than GRPO's z-scores, and at 1e-2 it learned within 30 steps on one init seed of four.
    "remax": ["algo.advantage=remax", "train.lr=5e-2"],
    "opo": ["algo.advantage=opo", "algo.aggregation=seq_mean_token_sum"],
    "reinforce_pp_baseline": ["algo.advantage=reinforce_pp_baseline", "algo.kl_coef=0.001", "algo.kl_estimator=k2"],
    "grpo_batch_std": ["algo.advantage=grpo_batch_std", "algo.dual_clip=3"],
    "gspo": ["algo.objective=gspo", "algo.aggregation=seq_mean_token_mean", "algo.clip_low=3e-4", "algo.clip_high=4e-4",
             "train.mini_batches=2"],
    "gmpo": ["algo.objective=gmpo", "algo.aggregation=seq_mean_token_mean", "algo.clip_low=0.4", "algo.clip_high=0.4"],
    "cispo": ["algo.objective=cispo", "algo.clip_low=1.0", "algo.clip_high=4.0", "train.mini_batches=2"],
    "clip_cov": ["algo.objective=clip_cov", "algo.clip_cov_ratio=0.02"],
    "kl_cov": ["algo.objective=kl_cov", "algo.kl_cov_ratio=0.02"],
    "reinforce_pp": ["algo.advantage=reinforce_pp", "algo.objective=reinforce", "algo.kl_coef=0.01",
                     "algo.kl_in=reward", "algo.kl_estimator=k1"],
    "ppo_gae": ["algo.advantage=gae", "algo.lam=0.95", "critic.lr=1e-2", "train.ppo_epochs=2", "train.mini_batches=2"],
    "sapo": ["algo.objective=sapo", "algo.aggregation=seq_mean_token_mean", "train.mini_batches=2"],
    "dppo_tv": ["algo.objective=dppo_tv", "train.mini_batches=2"],
    "dppo_kl": ["algo.objective=dppo_kl", "algo.dppo_delta_low=0.05", "algo.dppo_delta_high=0.05",
                "train.mini_batches=2"],
    # TOPR on samples one step behind the learner, its own weight instead of truncated IS.
    "topr": ["algo.objective=topr", "algo.advantage=dr_grpo", "algo.tis=off", "rollout.max_staleness=1"],
    "gdpo": ["algo.advantage=gdpo"],
    "maxrl": ["algo.advantage=maxrl"],
    "luspo": ["algo.objective=gspo", "algo.aggregation=seq_mean_token_sum", "algo.clip_low=3e-4",
              "algo.clip_high=4e-4", "train.mini_batches=2"],
    # Masked importance sampling on stale samples: the geometric-mean sequence mask.
    "mis": ["rollout.max_staleness=1", "algo.mis=geometric", "algo.mis_low=0.5", "algo.mis_high=2.0"],
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_learns(family, tiny_model_dir, tmp_path):
    train(tiny_config(tiny_model_dir, tmp_path / family, "train.steps=30", *FAMILIES[family]),
          task=TASK, reward=share_of_a)
    curve = reward_curve(tmp_path / family)
    assert sum(curve[-5:]) / 5 > sum(curve[:3]) / 3 + 0.3, curve


def test_entropy_bonus_raises_entropy(tmp_path):
    # A reward of 0 everywhere leaves only the entropy term: the policy must spread out. The model
    # starts peaked (large initial weights), far from the uniform distribution's maximum entropy.
    from helpers import build_tiny_model

    def nothing(completion, problem):
        return 0.0

    model_dir = build_tiny_model(tmp_path / "model", initializer_range=0.3)
    train(tiny_config(model_dir, tmp_path / "ent", "train.steps=8", "algo.entropy_coef=1.0",
                      "algo.objective=reinforce"), task=TASK, reward=nothing)
    lines = [json.loads(line) for line in (tmp_path / "ent" / "metrics.jsonl").read_text().splitlines()]
    entropy = [m["entropy/mean"] for m in lines if "entropy/mean" in m]
    # +0.94 measured with the bonus; without it (entropy_coef=0) +0.02, wandering by about 0.04 a step
    assert entropy[-1] > entropy[0] + 0.3, entropy


def test_critic_adaptive_kl_and_reference_reset_resume_exactly(tiny_model_dir, tmp_path):
    extra = ("algo.advantage=gae", "critic.lr=1e-2", "algo.kl_coef=0.05", "algo.kl_in=reward", "algo.kl_target=0.01",
             "algo.kl_horizon=64", "algo.ref_reset_every=2", "train.mini_batches=2", "train.micro_batch_size=5")
    train_straight_and_resumed(tiny_model_dir, tmp_path, *extra)
    straight = parameters(tmp_path / "straight" / "checkpoints" / "step_000004" / "policy")
    resumed = parameters(tmp_path / "resumed" / "checkpoints" / "step_000004" / "policy")
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    state = {run: load_trainer_state(tmp_path / run / "checkpoints" / "step_000004") for run in ("straight", "resumed")}
    assert state["straight"]["kl_coef"]["value"] != 0.05  # it adapted
    assert state["straight"]["kl_coef"] == state["resumed"]["kl_coef"]
    for name, value in state["straight"]["critic"]["model"].items():
        assert torch.equal(value, state["resumed"]["critic"]["model"][name]), name
    for name, value in state["straight"]["reference"].items():
        assert torch.equal(value, state["resumed"]["reference"][name]), name
    # the reference was reset at steps 2 and 4: it is the policy of step 4, not the initial model
    reference = state["straight"]["reference"]
    assert all(torch.equal(reference[name], straight[name]) for name in straight if name in reference)
    assert any(not torch.equal(reference[name], value) for name, value in parameters(tiny_model_dir).items()
               if name in reference)


@declare(level="tree", min_group_size=2)
def negated_treerl(rewards_G: torch.Tensor, *, under_SG: torch.Tensor, parent_S: torch.Tensor) -> torch.Tensor:
    from reasonrl.algo.tree import treerl

    return -treerl(rewards_G, under_SG=under_SG, parent_S=parent_S)


@pytest.mark.parametrize("estimator", ["treerl", f"{__name__}:negated_treerl"])
def test_tree_rollouts_learn_and_a_flipped_sign_unlearns(estimator, tiny_model_dir, tmp_path):
    # Groups of 8 sampled as 2x2x2 trees of 3-token segments (the last level: the 2 tokens left):
    # 2 x 3 + 4 x 3 + 8 x 2 = 34 generated tokens per group at most, against 64 for 8 samples.
    run = tmp_path / "tree"
    train(tiny_config(tiny_model_dir, run, "train.steps=30", f"algo.advantage={estimator}", "rollout.tree=2x2x2",
                      "rollout.tree_segment_tokens=3"), task=TASK, reward=share_of_a)
    curve = reward_curve(run)
    change = sum(curve[-5:]) / 5 - sum(curve[:3]) / 3
    assert (change > 0.3) if estimator == "treerl" else (change <= 0), curve
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(m["rollout/generated_tokens"] <= 4 * 34 for m in lines if "rollout/generated_tokens" in m)
    steps = [m for m in lines if "rollout/tree_completions_mean" in m]
    assert len(steps) == 30 and all(m["rollout/tree_segment_tokens"] == 3 for m in steps)
    assert all(2 <= m["rollout/tree_completions_mean"] <= 8 for m in steps)


def test_adaptive_tree_segments_resume_exactly(tiny_model_dir, tmp_path):
    # Segments adapt to the previous step's mean completion length (a 2x2x2 tree of 24 tokens at most,
    # ended early by the stop string "e": 8 tokens per segment at the first step); that length is
    # checkpointed, so a resumed run branches where the uninterrupted one does.
    tree = ("rollout.tree=2x2x2", "rollout.tree_segment_tokens=0", "rollout.max_new_tokens=24", 'rollout.stop=["e"]')
    train_straight_and_resumed(tiny_model_dir, tmp_path, *tree)
    segments = {}
    for arm in ("straight", "resumed"):
        lines = [json.loads(line) for line in (tmp_path / arm / "metrics.jsonl").read_text().splitlines()]
        segments[arm] = [m["rollout/tree_segment_tokens"] for m in lines if "rollout/tree_segment_tokens" in m]
    assert segments["straight"] == segments["resumed"] and segments["straight"][0] == 8, segments
    assert len(set(segments["straight"])) > 1, segments  # it adapted
    state = load_trainer_state(tmp_path / "resumed" / "checkpoints" / "step_000002")
    assert state["tree_sampler"]["mean_length"] > 0
    assert reward_curve(tmp_path / "straight") == reward_curve(tmp_path / "resumed")


def test_every_training_step_starts_at_ratio_one_under_bf16(tiny_model_dir, tmp_path):
    # Through the whole loop, with the KL in the reward (whose log-probs are computed before the update):
    # each step's first optimizer step sees the policy that computed its old log-probs, bit for bit.
    run = tmp_path / "gspo"
    train(tiny_config(tiny_model_dir, run, "train.steps=3", "train.dtype=bfloat16", "train.mini_batches=4",
                      "algo.objective=gspo", "algo.aggregation=seq_mean_token_mean", "algo.clip_low=3e-4",
                      "algo.clip_high=4e-4", "algo.kl_coef=0.01", "algo.kl_in=reward", "algo.kl_estimator=k1"),
          task=TASK, reward=share_of_a)
    updates = [json.loads(line) for line in (run / "updates.jsonl").read_text().splitlines()]
    assert [(u["step"], u["optimizer_step"]) for u in updates] == [(s, k) for s in (1, 2, 3) for k in range(4)]
    for first in (u for u in updates if u["optimizer_step"] == 0):
        assert first["loss/ratio_mean"] == 1.0 and first["loss/ratio_max"] == 1.0 and first["loss/clip_frac"] == 0.0
    assert max(u["loss/ratio_max"] for u in updates) > 1.0  # lr 1e-2: later optimizer steps move off 1
