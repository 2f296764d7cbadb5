"""OPO's claim measured directly: the variance of the policy gradient with the length-weighted
baseline against the group mean, on the same samples of the base model (no training).

Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline": for sequence-level REINFORCE,
g = (1/G) sum_i (r_i - b) grad log pi(y_i), the variance-minimising baseline is
b* = E[|grad log pi(y)|^2 r] / E[|grad log pi(y)|^2]; with |grad log pi(y)|^2 taken proportional
to the length |y|, b = sum_i |y_i| r_i / sum_i |y_i| (reasonrl.algo.advantages.opo), against the
plain group mean b = mean_i r_i (Dr. GRPO's).

For each problem, `groups` independent groups of G samples are drawn from SmolLM2-135M-Instruct
and scored with the default reward; each group's g is computed with both baselines from the same
samples (two backward passes of the weighted token-sum log-likelihood, gradients of the last
decoder layer only: 3.5M weights, enough to compare variances and cheap to store). The variance
of an estimator is the trace of its covariance over the groups; a problem whose groups all got
equal rewards has no gradient under either baseline and is left out.

Used by benchmarks/claims.py (claim 7).
"""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

import torch

GROUP_SIZE = 8
TEMPERATURE = 0.7
MAX_NEW_TOKENS = 64


def baselines(rewards_G: torch.Tensor, lengths_G: torch.Tensor) -> dict[str, float]:
    """The two baselines of one group: its mean reward, and OPO's length-weighted mean."""
    return {"group_mean": float(rewards_G.mean()),
            "opo": float((lengths_G * rewards_G).sum() / lengths_G.sum().clamp(min=1))}


def trace_of_covariance(vectors: list[torch.Tensor]) -> float:
    """sum over coordinates of the variance over the vectors (unbiased)."""
    stacked = torch.stack(vectors)
    return float(((stacked - stacked.mean(0)) ** 2).sum() / (len(vectors) - 1))


def group_gradients(model: Any, group: Any, pad_id: int, weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """For each per-sample weight vector w, the flat gradient of sum_i w_i log pi(y_i) over the
    trainable weights (sequence log-likelihood = token sum at the sampling temperature)."""
    from reasonrl.training.learner import make_train_batch
    from reasonrl.training.token_stats import token_logprobs

    batch = make_train_batch([group], [0.0] * group.size, pad_id)
    trainable = [p for p in model.parameters() if p.requires_grad]
    logp_NT, _ = token_logprobs(model, batch, TEMPERATURE)
    sequence_logp_N = (logp_NT * batch.loss_mask_NT).sum(1)
    gradients = []
    for index, w_N in enumerate(weights):
        grads = torch.autograd.grad((w_N * sequence_logp_N).sum(), trainable, retain_graph=index < len(weights) - 1)
        gradients.append(torch.cat([g.reshape(-1) for g in grads]))
    return gradients


def measure(seed: int, *, problems: int = 8, groups: int = 16) -> dict[str, Any]:
    """One seed's problems: per problem the two variances, and the mean log ratio OPO / group mean."""
    from reasonrl.build import build_models, build_task, build_weighted_reward
    from reasonrl.config import load_config
    from reasonrl.rewards import score_groups
    from reasonrl.seeds import derive_seed
    from reasonrl.types import SamplingParams

    cfg = load_config(None, [f"run.seed={seed}"])
    torch.manual_seed(seed)
    _, policy, engine, _ = build_models(cfg, torch.device("cpu"), None)
    reward = build_weighted_reward(cfg, None, policy=policy, prompt_ids_fn=engine.prompt_ids, tokenizer=engine.tokenizer)
    layers = policy.get_decoder().layers
    for name, param in policy.named_parameters():
        param.requires_grad_(name.startswith(f"model.layers.{len(layers) - 1}."))
    task = build_task(cfg)
    chosen = random.Random(seed).sample(range(len(task.train)), problems)
    per_problem = []
    for rank, index in enumerate(chosen):
        problem = task.train[index]
        sampling = SamplingParams(n=GROUP_SIZE, temperature=TEMPERATURE, max_new_tokens=MAX_NEW_TOKENS,
                                  seed=derive_seed(seed, "opo_variance", rank))
        scored = score_groups(engine.generate([problem] * groups, sampling), reward)
        estimates: dict[str, list[torch.Tensor]] = {"group_mean": [], "opo": []}
        for group in scored:
            rewards_G = torch.tensor(group.rewards, dtype=torch.float32)
            lengths_G = torch.tensor([len(c.token_ids) for c in group.completions], dtype=torch.float32)
            names, values = zip(*baselines(rewards_G, lengths_G).items())
            weights = [(rewards_G - b) / GROUP_SIZE for b in values]
            for name, gradient in zip(names, group_gradients(policy, group, engine.pad_id, weights)):
                estimates[name].append(gradient)
        rewards = [r for group in scored for r in group.rewards]
        variances = {name: trace_of_covariance(vectors) for name, vectors in estimates.items()}
        per_problem.append({"problem": problem.id, "reward_mean": statistics.fmean(rewards),
                            "reward_groups_with_spread": sum(max(g.rewards) > min(g.rewards) for g in scored),
                            "variance": variances})
    usable = [p for p in per_problem if p["variance"]["group_mean"] > 0 and p["variance"]["opo"] > 0]
    log_ratios = [math.log(p["variance"]["opo"] / p["variance"]["group_mean"]) for p in usable]
    return {"seed": seed, "problems": per_problem, "usable_problems": len(usable),
            "log_variance_ratio_mean": statistics.fmean(log_ratios) if log_ratios else math.nan}
