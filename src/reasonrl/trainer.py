"""The RL loop: sample problems -> generate -> score -> advantages -> update -> sync weights ->
log -> evaluate -> checkpoint. One readable function; what varies between algorithms lives in
the parts it calls (reasonrl.algo, reasonrl.rewards, the engine), chosen by name in the config.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from reasonrl.algo.kl import AdaptiveKLCoef
from reasonrl.build import (
    UserReward,
    build_estimation,
    build_learner,
    build_models,
    build_policy_loss,
    build_sampler,
    build_sampling,
    build_task,
    build_weighted_reward,
    merged_state_dict,
)
from reasonrl.checkpoint import save_checkpoint
from reasonrl.config import Config
from reasonrl.eval import CORRECT, by_source, evaluate, summarize
from reasonrl.guidance import Guidance, GuidanceSettings
from reasonrl.rewards import RewardError, WeightedReward, score_groups
from reasonrl.rewards.compose import OnError
from reasonrl.rollout.pipeline import RolloutPipeline
from reasonrl.runs import open_run, start_run, trainer_state
from reasonrl.runtime import keep_freed_memory
from reasonrl.sampling import (
    DYNAMIC_KEEP,
    PassRates,
    ReplayBuffer,
    allocate_samples,
    fill_batch,
    generate_with_budget,
    group_accuracy,
    has_reward_spread,
)
from reasonrl.sampling.stages import Stage, from_sources, parse_stages, stage_at
from reasonrl.seeds import derive_seed
from reasonrl.tasks import Task
from reasonrl.types import Group, Problem, SamplingParams


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    steps: int
    eval_before: dict[str, float] | None
    eval_after: dict[str, float] | None


def train(cfg: Config, *, task: Task | None = None, reward: UserReward | None = None) -> TrainResult:
    """Train the policy of `cfg` on `task` (default: the one cfg.task names) with `reward`
    (default: cfg.reward's components; a callable is used alone; a dict maps component
    names to (callable, weight))."""
    start = start_run(cfg)
    cfg, run_dir, resume_from, device = start.cfg, start.run_dir, start.resume_from, start.device
    if device.type == "cpu" and cfg.run.keep_freed_memory:
        keep_freed_memory()
    task = task or build_task(cfg)
    tokenizer, policy, engine, ref_model = build_models(cfg, device, resume_from)
    reward_fn = build_weighted_reward(cfg, reward, policy=policy, prompt_ids_fn=engine.prompt_ids,
                                      tokenizer=engine.tokenizer)
    learner = build_learner(cfg, policy, device)
    sampling = build_sampling(cfg)
    estimate = build_estimation(cfg, learner, ref_model=ref_model, engine=engine, reward_fn=reward_fn,
                                sampling=sampling, device=device)
    critic = estimate.critic
    sampler = build_sampler(cfg, task)
    index_of = {id(problem): index for index, problem in enumerate(task.train)}
    mixture = len({str(p.metadata.get("source")) for p in (*task.train, *task.test)}) > 1
    kl_coef = AdaptiveKLCoef(cfg.algo.kl_coef, target=cfg.algo.kl_target, horizon=cfg.algo.kl_horizon)
    pass_rates = PassRates(cfg.sampling.pass_rate_decay) if cfg.sampling.adaptive_budget else None
    replay = ReplayBuffer(cfg.sampling.replay, seed=cfg.run.seed) if cfg.sampling.replay else None
    guidance = _guidance(cfg, engine)
    pipeline: RolloutPipeline[Rollouts] = RolloutPipeline(engine, max_staleness=cfg.rollout.max_staleness,
                                                          last_step=cfg.train.steps)
    stateful = {"learner": learner, "sampler": sampler, "kl_coef": kl_coef, "critic": critic,
                "pass_rates": pass_rates, "replay": replay, "guidance": guidance,
                "pipeline": pipeline if cfg.rollout.max_staleness else None}
    step, logger = open_run(start, stateful, ref_model)
    loss = build_policy_loss(cfg)
    updates = {"epochs": cfg.train.ppo_epochs, "mini_batches": cfg.train.mini_batches,
               "micro_batch_size": cfg.train.micro_batch_size}

    def run_eval(at_step: int) -> dict[str, float]:
        metrics = evaluate(engine, task.test[: cfg.eval.problems], reward_fn, temperature=cfg.rollout.temperature,
                           samples=cfg.eval.samples, greedy=cfg.eval.greedy, max_new_tokens=cfg.rollout.max_new_tokens,
                           stop=cfg.rollout.stop, seed=derive_seed(cfg.run.seed, "eval"),
                           progress=cfg.run.progress, on_error=cfg.reward.on_error, per_source=mixture)
        logger.log(at_step, metrics)
        return metrics

    eval_before = run_eval(step) if cfg.eval.before and step == 0 and cfg.eval.problems else None
    bar = tqdm(total=cfg.train.steps, initial=step, desc="train", unit="step", disable=not cfg.run.progress)
    rounds = cfg.sampling.max_rounds if cfg.sampling.dynamic else 1
    keep = DYNAMIC_KEEP[cfg.sampling.dynamic_keep] if cfg.sampling.dynamic else _every_group
    stages = parse_stages(cfg.sampling.stages)

    def produce(at_step: int, version: int) -> Rollouts:
        """Step `at_step`'s scored groups, generated by the policy of `version`."""
        stage = stage_at(stages, at_step)
        spent = Rollouts(sampling=_staged(sampling, stage))

        def draw(count: int) -> list[Problem]:
            with pipeline.lock:
                return [task.train[i] for i in from_sources(sampler.next, task.train, stage and stage.sources, count)]

        def rollout(problems: list[Problem], round_index: int) -> list[Group]:
            seeded = replace(spent.sampling, seed=derive_seed(cfg.run.seed, at_step,
                                                              *([round_index] if round_index else [])))
            indices = [index_of[id(problem)] for problem in problems]
            started = time.perf_counter()
            if pass_rates is not None:
                with pipeline.lock:
                    rates = [pass_rates.get(i) for i in indices]
                counts = allocate_samples(rates, len(problems) * seeded.n, min_samples=cfg.sampling.min_samples)
                generated = generate_with_budget(engine, problems, seeded, counts)
            else:
                generated = engine.generate(problems, seeded)
            generated = [_tagged(group, version) for group in generated]
            spent.generate_s += time.perf_counter() - started
            spent.tokens += sum(len(c.token_ids) for g in generated for c in g.completions)
            scored, failed = _scored(generated, reward_fn, cfg.reward.on_error, at_step)
            spent.failed.extend(failed)
            with pipeline.lock:
                return observed(scored, at_step)

        spent.groups, spent.sampling_metrics = fill_batch(draw, rollout, cfg.rollout.prompts_per_step,
                                                          max_rounds=rounds, keep=keep)
        return spent

    def observed(scored: list[Group], at_step: int) -> list[Group]:
        """Tell the sampler, pass rates, guidance and replay how the groups did (replay may put
        a remembered correct completion into an all-wrong group)."""
        scored_indices = [index_of[id(g.problem)] for g in scored]
        accuracies = [group_accuracy(g) for g in scored]
        sampler.observe(scored_indices, accuracies)
        if pass_rates is not None:
            for index, accuracy in zip(scored_indices, accuracies):
                pass_rates.update(index, accuracy)
        if guidance is not None:  # before replay: a group is failed by its own samples
            guidance.observe(scored_indices, scored, at_step)
        if replay is not None:
            scored = [_with_replay(replay, index, group, reward_fn, cfg.reward.on_error, at_step)
                      for index, group in zip(scored_indices, scored)]
        return scored

    pipeline.start(produce, step)
    eval_after = None
    deadline = time.monotonic() + 60 * cfg.train.max_minutes if cfg.train.max_minutes else math.inf
    try:
        while step < cfg.train.steps:
            started = time.perf_counter()
            produced, waited = pipeline.next(step)
            rollouts = produced.value
            groups, failed = rollouts.groups, rollouts.failed
            generated = time.perf_counter()
            logger.log_reward_errors(step + 1, failed)
            batch, metrics = estimate(groups, engine.pad_id, kl_coef.value)
            in_loss = kl_coef.value if cfg.algo.kl_in == "loss" else 0.0
            with pipeline.lock:
                auxiliary = guidance.auxiliary(step) if guidance is not None else None
            metrics |= learner.update(batch, replace(loss, kl_coef=in_loss), ref_model=ref_model, step=step,
                                      auxiliary=auxiliary, **updates)
            logger.log_optimizer_steps(step + 1, learner.optimizer_steps)
            if critic is not None:
                metrics |= critic.update(batch, step=step, **updates)
            if guidance is not None:
                with pipeline.lock:
                    interleaved = guidance.interleaved(step + 1)
                if interleaved is not None:
                    supervised = learner.update(*interleaved, micro_batch_size=cfg.train.micro_batch_size, step=step)
                    metrics["loss/guidance"] = supervised["loss/policy"]
                if "loss/auxiliary" in metrics:
                    metrics["loss/guidance"] = metrics.pop("loss/auxiliary")
                with pipeline.lock:
                    metrics |= guidance.metrics(step)
            pipeline.publish(step + 1, learner.named_weights())
            step += 1
            if "kl/mean" in metrics:
                metrics["kl/coef"] = kl_coef.value
                kl_coef.update(metrics["kl/mean"], samples=batch.num_sequences)
            if cfg.algo.ref_reset_every and step % cfg.algo.ref_reset_every == 0:
                ref_model.load_state_dict(merged_state_dict(policy))
            advantages = [float(a) for a in batch.advantages_NT.sum(1) / batch.loss_mask_NT.sum(1).clamp(min=1)]
            metrics.update(_rollout_metrics(groups))
            with pipeline.lock:
                metrics |= sampler.metrics() | (rollouts.sampling_metrics if cfg.sampling.dynamic else {})
                metrics |= replay.metrics() if replay is not None else {}
            if mixture:
                metrics |= by_source(groups, lambda metric: f"source/{metric}/")
            if cfg.reward.on_error == "skip_group":
                metrics["reward/error_groups"] = len(failed)
            if cfg.rollout.max_staleness:
                metrics |= _staleness_metrics(groups, step - 1, waited)
            finished = time.perf_counter()
            metrics.update({"perf/step_s": finished - started, "perf/generate_s": rollouts.generate_s,
                            "rollout/generated_tokens": rollouts.tokens,
                            "perf/update_s": finished - generated,
                            "perf/tokens_per_s": rollouts.tokens / max(rollouts.generate_s, 1e-9)})
            logger.log(step, metrics)
            logger.log_rollouts(step, groups, advantages)
            accuracy = {"acc": f"{metrics[f'reward/{CORRECT}']:.2f}"} if f"reward/{CORRECT}" in metrics else {}
            bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", **accuracy,
                            tok_s=f"{metrics['perf/tokens_per_s']:.0f}")
            bar.update()
            if cfg.run.log_every and step % cfg.run.log_every == 0:
                tqdm.write(_format_step(step, metrics))
            if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.train.steps and cfg.eval.problems:
                with pipeline.idle():
                    _report_eval(run_eval(step), step)
            out_of_time = time.monotonic() > deadline
            if step == cfg.train.steps or out_of_time or (cfg.run.save_every and step % cfg.run.save_every == 0):
                save_checkpoint(run_dir, step, model=policy, tokenizer=tokenizer, keep=cfg.run.keep_checkpoints,
                                state=trainer_state(stateful, ref_model if cfg.algo.ref_reset_every else None))
            if out_of_time:
                tqdm.write(f"train.max_minutes={cfg.train.max_minutes:g} reached after step {step}: stopping here "
                           "(checkpoint saved; run.resume=true continues)")
                break
        bar.close()
        pipeline.close()
        eval_after = run_eval(step) if cfg.eval.problems else None
    finally:
        pipeline.close()
        for part in (learner, engine):  # Ray actors, if any (the engine last: it may stop Ray)
            if hasattr(part, "shutdown"):
                part.shutdown()
    _report_eval(eval_after, step, eval_before)
    logger.close()
    return TrainResult(run_dir=run_dir, steps=step, eval_before=eval_before, eval_after=eval_after)


@dataclass
class Rollouts:
    """A step's groups, and what producing them took over all rounds of dynamic sampling."""

    sampling: SamplingParams
    groups: list[Group] = field(default_factory=list)
    sampling_metrics: dict[str, float] = field(default_factory=dict)
    generate_s: float = 0.0
    tokens: int = 0
    failed: list[Group] = field(default_factory=list)


def _tagged(group: Group, version: int) -> Group:
    return replace(group, completions=tuple(replace(c, policy_version=version) for c in group.completions))


def _staleness_metrics(groups: list[Group], learner_version: int, waited_s: float) -> dict[str, float]:
    """How many updates behind the learner the trained samples were (replayed ones included),
    and how long the learner waited for them."""
    behind = [learner_version - c.policy_version for g in groups for c in g.completions
              if c.policy_version is not None]
    return {"async/staleness_mean": sum(behind) / max(len(behind), 1),
            "async/staleness_max": float(max(behind, default=0)), "async/wait_s": waited_s}


def _scored(groups: list[Group], reward_fn: WeightedReward, on_error: OnError, step: int,
            ) -> tuple[list[Group], list[Group]]:
    """The scored groups, and those whose reward failed (left out of the step when skipped)."""
    scored = score_groups(groups, reward_fn, on_error)
    failed = [group for group in scored if group.reward_error is not None]
    if len(failed) == len(scored):
        raise RewardError(f"the reward failed on every group of step {step + 1}; the first: {failed[0].reward_error}")
    return [group for group in scored if group.reward_error is None], failed


def _with_replay(replay: ReplayBuffer, index: int, group: Group, reward_fn: WeightedReward, on_error: OnError,
                 step: int) -> Group:
    """The group, or, when all its completions are wrong and the problem was solved before, the
    group with a remembered correct completion in place of its last one (scored again)."""
    replay.add(index, group)
    mixed = replay.mixed(index, group, step)
    if mixed is None:
        return group
    rescored = score_groups([mixed], reward_fn, on_error)[0]
    return group if rescored.reward_error is not None else rescored


def _guidance(cfg: Config, engine: Any) -> Guidance | None:
    g = cfg.guidance
    if g.mode == "off":
        return None
    settings = GuidanceSettings(mode=g.mode, weight=g.weight, schedule=g.schedule,
                                decay_steps=g.decay_steps or cfg.train.steps, on=g.on, source=g.source,
                                solution_field=g.solution_field, weighting=g.weighting, gamma=g.gamma, every=g.every,
                                max_tokens=g.max_tokens)
    return Guidance(settings, tokenizer=engine.tokenizer, chat_template=cfg.model.chat_template, pad_id=engine.pad_id,
                    seed=cfg.run.seed)


def _staged(sampling: SamplingParams, stage: Stage | None) -> SamplingParams:
    if stage is None:
        return sampling
    return replace(sampling, max_new_tokens=stage.max_new_tokens or sampling.max_new_tokens,
                   n=stage.group_size or sampling.n)


def _every_group(group: Group) -> bool:
    return True


def _rollout_metrics(groups: list[Group]) -> dict[str, float]:
    metrics = {}
    for key, value in summarize(groups, "").items():
        if key in ("len_mean", "truncated_frac"):
            metrics[f"rollout/{key}"] = value
        else:
            metrics[f"reward/{key.removeprefix('reward_')}"] = value
    rewards = torch.tensor([r for group in groups for r in group.rewards])
    metrics["reward/std"] = rewards.std().item() if rewards.numel() > 1 else 0.0
    metrics["rollout/zero_std_frac"] = sum(not has_reward_spread(group) for group in groups) / len(groups)
    if all(CORRECT in group.reward_components for group in groups):
        # Lengths of right and wrong answers apart: a length bias shows as wrong answers growing.
        for name, wanted in (("correct", True), ("wrong", False)):
            lengths = [len(c.token_ids) for g in groups for c, v in zip(g.completions, g.reward_components[CORRECT])
                       if (v > 0) == wanted]
            if lengths:
                metrics[f"rollout/len_{name}_mean"] = sum(lengths) / len(lengths)
    return metrics


_CONSOLE_METRICS = ("reward/mean", f"reward/{CORRECT}", "loss/policy", "loss/clip_frac", "kl/mean", "entropy/mean",
                    "rollout/len_mean", "perf/tokens_per_s", "perf/step_s")


def _format_step(step: int, metrics: Mapping[str, float]) -> str:
    shown = "  ".join(f"{key}={metrics[key]:.4g}" for key in _CONSOLE_METRICS if key in metrics)
    return f"step {step}: {shown}"


def _report_eval(after: dict[str, float] | None, step: int, before: dict[str, float] | None = None) -> None:
    if not after:
        return
    lines = [f"eval at step {step}:"]
    for key in sorted(k for k in after if k.endswith(("accuracy", "reward_mean"))):
        line = f"  {key}: {after[key]:.3f}"
        if before and key in before:
            line += f"  (before {before[key]:.3f}, change {after[key] - before[key]:+.3f})"
        lines.append(line)
    tqdm.write("\n".join(lines))
