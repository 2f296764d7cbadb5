"""Rejection-sampling fine-tuning (expert iteration): sample, keep what the verifier accepts, fine-tune
on it, repeat. RFT (Yuan et al. 2023, "Scaling Relationship on Learning Mathematical Reasoning with
Large Language Models"), STaR (Zelikman et al. 2022) and expert iteration (Anthony et al. 2017)
share this loop; RAFT (Dong et al. 2023) is the same with a reward model's best sample.

Each round draws `rft.problems_per_round` training problems, samples rollout.group_size
completions per problem with the current policy, scores them with the reward (cfg.reward, or the
one given), keeps the distinct completions that solved their problem (`Group.solved`: the "correct"
component at full credit, else a total reward above 0), and runs `rft.steps_per_round` SFT steps of `sft.batch_size` kept samples. The kept
completions are trained on exactly as generated (their token ids, not a re-tokenisation of the
text). train.steps counts rounds; a checkpoint closes each round (resume continues the next).
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from reasonrl.build import (
    UserReward,
    build_models,
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
from reasonrl.stages.sft import sft_update
from reasonrl.tasks import Task
from reasonrl.training.skeleton import PolicyCheckpoints, RunLoop, show_metrics, start_stage
from reasonrl.types import Group


def accepted(groups: list[Group]) -> list[Group]:
    """One-completion groups of every distinct verified-correct completion (the SFT targets)."""
    kept = []
    for group in groups:
        correct = group.solved
        seen: set[tuple[int, ...]] = set()
        for g, completion in enumerate(group.completions):
            if correct[g] and completion.token_ids not in seen:
                seen.add(completion.token_ids)
                kept.append(Group(problem=group.problem, prompt_ids=group.prompt_ids, completions=(completion,)))
    return kept


def train_rft(cfg: Config, *, task: Task | None = None, reward: UserReward | None = None) -> Path:
    """Expert iteration for cfg.train.steps rounds; returns the final checkpoint."""

    check_user_reward(cfg, reward)
    start = start_stage(cfg)
    cfg, device = start.cfg, start.device
    task = build_task(cfg, task)
    tokenizer, policy, engine, _ = build_models(cfg, device, start.resume_from, reference=False)
    learner = build_supervised_learner(cfg, policy, device, updates_per_step=cfg.rft.steps_per_round)
    reward_fn = build_weighted_reward(cfg, reward, policy=policy, prompt_ids_fn=engine.prompt_ids,
                                      tokenizer=engine.tokenizer)
    sampler = EpochSampler(len(task.train), seed=cfg.run.seed)
    stateful = {"learner": learner, "sampler": sampler}
    loop = RunLoop.open(start, stateful, save=PolicyCheckpoints(start, stateful, model=policy, tokenizer=tokenizer),
                        desc="rft", unit="round", show=show_metrics(kept=("rft/kept", ".0f"),
                                                                    reward=("reward/mean", ".3f"),
                                                                    log_every=cfg.run.log_every))
    sampling = build_sampling(cfg)

    def step() -> dict[str, float]:
        round_index = loop.step
        problems = [task.train[i] for i in sampler.next(cfg.rft.problems_per_round)]
        groups = score_groups(engine.generate(problems, replace(sampling, seed=derive_seed(cfg.run.seed, round_index))),
                              reward_fn)
        kept = accepted(groups)
        metrics = {"rft/kept": float(len(kept)),
                   "rft/solved_problems": float(len({g.problem.id for g in kept})),
                   "reward/mean": sum(r for g in groups for r in g.rewards) / sum(g.size for g in groups)}
        rng = random.Random(derive_seed(cfg.run.seed, "rft", round_index))
        for update in range(cfg.rft.steps_per_round if kept else 0):
            batch = rng.sample(kept, min(cfg.sft.batch_size, len(kept)))
            metrics |= sft_update(learner, batch, engine.pad_id, micro_batch_size=cfg.train.micro_batch_size,
                                  step=round_index * cfg.rft.steps_per_round + update)
        engine.load_weights(learner.named_weights())
        return metrics

    return loop.run_steps(step)
