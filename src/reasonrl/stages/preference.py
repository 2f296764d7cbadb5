"""Preference optimisation: DPO on offline (prompt, chosen, rejected) pairs, and online DPO on
pairs built from each group's best and worst verified completions.

DPO (Rafailov et al. 2023, "Direct Preference Optimization", eq. 7), with y_w preferred to y_l and
log-probabilities summed over the response tokens:

    L = -log sigmoid( beta * [ (log pi(y_w|x) - log pi_ref(y_w|x)) - (log pi(y_l|x) - log pi_ref(y_l|x)) ] )

averaged over pairs; the reference is the frozen starting policy. The implicit rewards
beta * (log pi - log pi_ref) of both responses are logged (`dpo/chosen_reward`,
`dpo/rejected_reward`) with the share of pairs they order correctly (`dpo/accuracy`).

Online DPO for verifiable tasks (as in Guo et al. 2024, "Direct Language Model Alignment from
Online AI Feedback", with a verifier as the annotator): sample G completions per problem, and
when their rewards differ, the highest-rewarded completion is chosen and the lowest rejected
(ties: the earliest); a group without spread yields no pair.

A step's pairs go through the model in one forward: the pair structure of the loss does not
split into independent micro-batches of sequences (choose the pairs per step accordingly).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from reasonrl.build import (
    UserReward,
    build_models,
    build_reference,
    build_sampling,
    build_supervised_learner,
    build_task,
    build_weighted_reward,
    check_user_reward,
)
from reasonrl.config import Config
from reasonrl.rewards import score_groups
from reasonrl.sampling import EpochSampler
from reasonrl.seeds import derive_seed
from reasonrl.stages.sft import sft_group
from reasonrl.tasks import Task
from reasonrl.training.learner import Learner, make_train_batch
from reasonrl.training.skeleton import PolicyCheckpoints, RunLoop, show_metrics, start_stage
from reasonrl.training.token_stats import token_logprobs
from reasonrl.types import Completion, Group, Problem


def dpo_loss(chosen_logp_N: torch.Tensor, rejected_logp_N: torch.Tensor, ref_chosen_logp_N: torch.Tensor,
             ref_rejected_logp_N: torch.Tensor, *, beta: float = 0.1) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean DPO loss over N pairs of summed response log-probs; and its implicit-reward metrics."""
    chosen_reward_N = beta * (chosen_logp_N - ref_chosen_logp_N)
    rejected_reward_N = beta * (rejected_logp_N - ref_rejected_logp_N)
    loss = -F.logsigmoid(chosen_reward_N - rejected_reward_N).mean()
    metrics = {"loss/dpo": loss.item(),"dpo/chosen_reward": chosen_reward_N.detach().mean().item(),
               "dpo/rejected_reward": rejected_reward_N.detach().mean().item(),
               "dpo/accuracy": (chosen_reward_N > rejected_reward_N).float().mean().item()}
    return loss, metrics


def pair_groups(problem: Problem, prompt_ids: Sequence[int], chosen: Completion, rejected: Completion,
                ) -> tuple[Group, Group]:
    return (Group(problem=problem, prompt_ids=tuple(prompt_ids), completions=(chosen,)),
            Group(problem=problem, prompt_ids=tuple(prompt_ids), completions=(rejected,)))


def best_and_worst(group: Group) -> tuple[Completion, Completion] | None:
    """Online DPO's pair of a scored group: (highest-rewarded, lowest-rewarded), or None without spread."""
    rewards = group.rewards
    best, worst = max(range(group.size), key=lambda g: (rewards[g], -g)), min(range(group.size), key=lambda g: (rewards[g], g))
    if rewards[best] == rewards[worst]:
        return None
    return group.completions[best], group.completions[worst]


def sequence_logprobs(model: Any, groups: Sequence[Group], pad_id: int) -> torch.Tensor:
    """Summed response log-probs of one-completion groups under `model` (temperature 1), (N,)."""
    batch = make_train_batch(groups, [0.0] * len(groups), pad_id)
    logp_NT, _ = token_logprobs(model, batch, temperature=1.0)
    return logp_NT.sum(dim=1)


def dpo_update(learner: Learner, ref_model: Any, pairs: Sequence[tuple[Group, Group]], pad_id: int, *,
               beta: float = 0.1) -> dict[str, float]:
    """One optimizer step of the DPO loss on (chosen, rejected) one-completion group pairs."""
    if not pairs:
        raise ValueError("dpo_update: no pairs")
    chosen, rejected = [c for c, _ in pairs], [r for _, r in pairs]
    with torch.no_grad(), learner.autocast():
        ref_chosen_N = sequence_logprobs(ref_model, chosen, pad_id).float()
        ref_rejected_N = sequence_logprobs(ref_model, rejected, pad_id).float()

    def loss() -> tuple[torch.Tensor, dict[str, float]]:
        logp_N = sequence_logprobs(learner.model, [*chosen, *rejected], pad_id).float()
        return dpo_loss(logp_N[: len(pairs)], logp_N[len(pairs):], ref_chosen_N, ref_rejected_N, beta=beta)

    return learner.step(loss)


def train_dpo(cfg: Config, *, task: Task | None = None, reward: UserReward | None = None) -> Path:
    """DPO for cfg.train.steps steps of cfg.dpo.pairs_per_step pairs; returns the final checkpoint.

    Offline (cfg.dpo.online false): each training problem's `answer` is the chosen response and
    `metadata[cfg.dpo.rejected_field]` the rejected one (task.answer_field names the chosen field).
    Online: problems are sampled, G = rollout.group_size completions generated with the current
    policy and scored with the reward (cfg.reward, or `reward`), and each group with a spread gives
    its best and worst completion as a pair. Resumable like `train`.
    """

    check_user_reward(cfg, reward)
    start = start_stage(cfg)
    cfg, device = start.cfg, start.device
    task = build_task(cfg, task)
    tokenizer, policy, engine, _ = build_models(cfg, device, start.resume_from, reference=False)
    ref_model = build_reference(cfg, device)
    learner = build_supervised_learner(cfg, policy, device)
    reward_fn = build_weighted_reward(cfg, reward, policy=policy, prompt_ids_fn=engine.prompt_ids,
                                      tokenizer=engine.tokenizer)
    sampler = EpochSampler(len(task.train), seed=cfg.run.seed)
    stateful = {"learner": learner, "sampler": sampler}
    loop = RunLoop.open(start, stateful, save=PolicyCheckpoints(start, stateful, model=policy, tokenizer=tokenizer),
                        desc="dpo", show=show_metrics(loss=("loss/dpo", ".3f"), log_every=cfg.run.log_every))
    d = cfg.dpo
    sampling = build_sampling(cfg)

    def step() -> dict[str, float]:
        problems = [task.train[i] for i in sampler.next(d.pairs_per_step)]
        metrics: dict[str, float] = {}
        if d.online:
            seed = derive_seed(cfg.run.seed, loop.step)
            groups = score_groups(engine.generate(problems, replace(sampling, seed=seed)), reward_fn)
            found = [(g, pair) for g in groups if (pair := best_and_worst(g)) is not None]
            pairs = [pair_groups(g.problem, g.prompt_ids, *pair) for g, pair in found]
            metrics["reward/mean"] = sum(r for g in groups for r in g.rewards) / sum(g.size for g in groups)
            metrics["dpo/pairs"] = float(len(pairs))
        else:
            pairs = [offline_pair(tokenizer, p, d.rejected_field, chat_template=cfg.model.chat_template,
                                  max_tokens=cfg.sft.max_tokens) for p in problems]
        if pairs:
            metrics |= dpo_update(learner, ref_model, pairs, engine.pad_id, beta=d.beta)
            if d.online:
                engine.load_weights(learner.named_weights())
        return metrics

    return loop.run_steps(step)


def offline_pair(tokenizer: Any, problem: Problem, rejected_field: str, *, chat_template: bool,
                 max_tokens: int) -> tuple[Group, Group]:
    """The (chosen, rejected) pair of a preference row: `answer` and `metadata[rejected_field]`."""
    rejected = problem.metadata.get(rejected_field)
    if not isinstance(rejected, str) or not rejected:
        raise ValueError(f"problem {problem.id!r}: DPO needs the rejected response in field {rejected_field!r} "
                         f"(dpo.rejected_field); fields: {', '.join(problem.metadata) or 'none'}")
    chosen_group = sft_group(tokenizer, problem, chat_template=chat_template, max_tokens=max_tokens)
    rejected_group = sft_group(tokenizer, replace(problem, answer=rejected), chat_template=chat_template,
                               max_tokens=max_tokens)
    return chosen_group, rejected_group
