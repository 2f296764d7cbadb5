"""The RL loop: sample problems -> generate -> score -> observe -> advantages -> update -> sync
weights -> log -> evaluate -> checkpoint. One readable function with no branch per feature: what
varies between algorithms lives in the parts it calls (reasonrl.algo, reasonrl.rewards, the engine),
chosen by name in the config; producing a step's rollouts is one call (reasonrl.rollout.producer);
the optional parts of a step (the sampler, pass rates, the methods' parts: replay, guidance, the
critic, the KL controller, ...) are participants the loop calls at fixed points
(reasonrl.participants), built with the run (`build_run`: the core objects, then each method of
reasonrl.methods.METHODS).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from reasonrl.build import (
    UserReward,
    build_estimation,
    build_learner,
    build_methods,
    build_models,
    build_policy_loss,
    build_reference,
    build_sampler,
    build_sampling,
    build_task,
    build_weighted_reward,
    check_user_reward,
    update_sizes,
)
from reasonrl.config import Config
from reasonrl.eval import evaluate
from reasonrl.guards.alarm_participant import build_alarms
from reasonrl.guards.sync_check import build_sync_check
from reasonrl.guards.watchdog import Watchdog
from reasonrl.methods import RunParts
from reasonrl.participants import (
    GeneratedTokens,
    Participants,
    PassRateBudget,
    ProblemSampler,
    SkippedGroups,
    SourceMetrics,
    Staleness,
    check_participants,
)
from reasonrl.rewards import WeightedReward
from reasonrl.rollout.producer import (  # older checkpoints: trainer.Rollouts
    Production,
    RolloutProducer,
    Rollouts,
    rollout_metrics,
)
from reasonrl.sampling import DYNAMIC_KEEP, PassRates
from reasonrl.sampling.stages import parse_stages
from reasonrl.seeds import derive_seed
from reasonrl.tasks import Task
from reasonrl.training.checkpoint import save_checkpoint
from reasonrl.training.learner import PolicyLoss
from reasonrl.training.logging import RunLogger, report_eval, show_progress
from reasonrl.training.runs import RunStart, already_complete, checkpoint_step, start_run, trainer_state
from reasonrl.training.runtime import KeptMemoryBound, keep_freed_memory, memory_metrics
from reasonrl.training.skeleton import RunLoop
from reasonrl.types import (
    Estimation,
    KLCoefficient,
    Learner,
    Participant,
    PolicyUpdate,
    RolloutEngine,
    SamplingParams,
    TrainBatch,
)


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    steps: int
    eval_before: dict[str, float] | None
    eval_after: dict[str, float] | None


@dataclass(frozen=True)
class TrainingRun:
    """What a training run is made of, built from its config by `build_run`."""

    cfg: Config
    run_dir: Path
    task: Task
    tokenizer: Any
    policy: Any
    engine: Any
    ref_model: Any
    reward_fn: WeightedReward
    learner: Learner
    estimate: Estimation
    loss: PolicyLoss
    kl: KLCoefficient
    participants: Participants
    producer: RolloutProducer
    watchdog: Watchdog

    @property
    def stateful(self) -> dict[str, Any]:
        """Every part with state to checkpoint, under its key in the checkpoint."""
        return {"learner": self.learner, **self.participants.stateful, **self.producer.stateful}


def train(cfg: Config, *, task: Task | None = None, reward: UserReward | None = None,
          participants: Sequence[Participant] = ()) -> TrainResult:
    """Train the policy of `cfg` on `task` (default: the one cfg.task names) with `reward`
    (default: cfg.reward's components; a callable is used alone; a dict maps component
    names to (callable, weight)); `participants` (reasonrl.Participant) take part in every step
    after the run's own (docs/callbacks.md)."""
    check_user_reward(cfg, reward)
    check_participants(participants)
    start = start_run(cfg)
    cfg = start.cfg
    if already_complete(start, cfg.train.steps):
        start.release()
        return TrainResult(run_dir=start.run_dir, steps=checkpoint_step(start.resume_from), eval_before=None,
                           eval_after=None)
    if start.device.type == "cpu" and cfg.run.keep_freed_memory:
        keep_freed_memory()
    kept_memory = KeptMemoryBound()
    run = build_run(start, task, reward, participants)
    loop = RunLoop.open(start, run.stateful, ref_model=run.ref_model, save=partial(_save_checkpoint, run),
                        desc="train", show=partial(show_progress, log_every=cfg.run.log_every))
    logger = loop.logger
    eval_before = _evaluate(run, logger, 0) if cfg.eval.before and loop.step == 0 and cfg.eval.problems else None
    eval_after = None
    try:
        run.participants.after_sync(loop.step)  # the engine holds the weights the first step starts from
        run.producer.start(loop.step)
        while loop.running():  # the progress bar and the train.max_minutes clock start here
            step, started = loop.step, time.perf_counter()
            rollouts = run.producer.next(step)  # sample -> generate -> score -> observe
            generated = time.perf_counter()
            logger.log_reward_errors(step + 1, rollouts.failed)
            if rollouts.learnable:
                batch, metrics = run.estimate(rollouts.groups, run.engine.pad_id, run.kl.value)
                update = run.participants.contribute(step, PolicyUpdate(run.loss))
                with run.watchdog.phase("update"):
                    metrics |= run.learner.update(batch, update.loss, ref_model=run.ref_model, step=step,
                                                  auxiliary=update.auxiliary, **update_sizes(cfg))
                logger.log_optimizer_steps(step + 1, run.learner.optimizer_steps)
                run.participants.after_update(step, batch, metrics)
            else:  # dynamic sampling kept no group: nothing to learn from, so no optimizer step either
                batch, metrics = None, {"sampling/skipped_update": 1.0}
            synced = time.perf_counter()
            with run.watchdog.phase("sync"):
                run.producer.publish(step + 1, run.learner.named_weights())
            synced = time.perf_counter() - synced
            run.participants.after_sync(step + 1)
            metrics |= rollout_metrics(rollouts.groups) | run.participants.metrics(step, rollouts)
            metrics |= _perf_metrics(rollouts, started, generated, finished=time.perf_counter(), sync_s=synced)
            metrics |= memory_metrics()
            if (released_gb := kept_memory.after_step()) is not None:
                metrics["perf/released_gb"] = released_gb
            step = loop.record(metrics)  # counted, logged, shown: from here `step` is the number done
            logger.log_rollouts(step, rollouts.groups, _advantages(batch))
            if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.train.steps and cfg.eval.problems:
                with run.producer.idle():
                    report_eval(_evaluate(run, logger, step), step)
            # A spent budget, or a participant's reason to stop, ends the loop.
            loop.save_if_due(spent=_tokens_spent(cfg, metrics) or run.participants.stop_reason(step))
        run.producer.close()
        eval_after = _evaluate(run, logger, loop.step) if cfg.eval.problems else None
    except KeyboardInterrupt:
        loop.close()
        raise loop.interrupted() from None
    finally:
        run.producer.close()
        run.watchdog.close()
        run.learner.close()  # Ray actors, if any
        run.engine.close()  # last: it may stop Ray
    report_eval(eval_after, loop.step, eval_before)
    loop.close()
    return TrainResult(run_dir=start.run_dir, steps=loop.step, eval_before=eval_before, eval_after=eval_after)


def _tokens_spent(cfg: Config, metrics: dict[str, float]) -> str:
    """train.max_generated_tokens, when the run has generated that many ('': not yet, or no such budget)."""
    tokens = cfg.train.max_generated_tokens
    if tokens and metrics["rollout/generated_tokens_total"] >= tokens:
        return f"train.max_generated_tokens={tokens} reached ({metrics['rollout/generated_tokens_total']:g})"
    return ""


def build_run(start: RunStart, task: Task | None, reward: UserReward | None,
              users: Sequence[Participant] = ()) -> TrainingRun:
    """The parts of the run `start` begins, built in an order that keeps its random streams (LoRA
    adapters and a critic's value head are initialised from torch's generator): the core objects,
    then what each method adds (reasonrl.methods.METHODS, in order), the participants, the producer,
    and the guards, which pause the producer while they probe the engine; the `users`' participants
    come after all of them."""
    cfg, device = start.cfg, start.device
    task = build_task(cfg, task)
    tokenizer, policy, engine, ref_model = build_models(cfg, device, start.resume_from)
    reward_fn = build_weighted_reward(cfg, reward, policy=policy, prompt_ids_fn=engine.prompt_ids,
                                      tokenizer=engine.tokenizer)
    learner = build_learner(cfg, policy, device)
    sampling = build_sampling(cfg)
    estimate = build_estimation(cfg, learner, ref_model=ref_model, engine=engine, reward_fn=reward_fn,
                                sampling=sampling)
    parts = build_methods(cfg, RunParts(
        task=task, tokenizer=tokenizer, policy=policy, engine=engine, ref_model=ref_model, reward_fn=reward_fn,
        learner=learner, device=device, run_dir=start.run_dir, update_sizes=update_sizes(cfg),
        reference=partial(build_reference, cfg, device), estimate=estimate, producer_engine=engine))
    if parts.kl is None:
        raise ValueError("no method holds the KL coefficient the estimation reads: keep reasonrl.methods.kl in "
                         "reasonrl.methods.METHODS")
    s = cfg.sampling
    sampler = ProblemSampler(build_sampler(cfg, task), task.train)
    budget = PassRateBudget(PassRates(s.pass_rate_decay), s.min_samples) if s.adaptive_budget else None
    own = [sampler, *([budget] if budget is not None else []), *parts.participants, *reports(cfg, task)]
    observers = Participants([*own, *users])
    watchdog = Watchdog(factor=cfg.run.hang_factor, floor_s=cfg.run.hang_floor_s)
    producer = build_producer(cfg, task, parts.producer_engine, reward_fn, sampling, observers, sampler=sampler,
                              budget=budget, phase=watchdog.phase)
    guards = [build_sync_check(cfg, task.train, engine=engine, learner=learner, pause=producer.idle),
              build_alarms(cfg, parts.alarm_thresholds)]
    builtin = Participants([*own, *(guard for guard in guards if guard is not None)])
    check_participants(users, taken={"learner", *builtin.stateful, *producer.stateful})
    participants = Participants([*builtin.parts, *users])
    return TrainingRun(cfg=cfg, run_dir=start.run_dir, task=task, tokenizer=tokenizer, policy=policy, engine=engine,
                       ref_model=ref_model, reward_fn=reward_fn, learner=learner, estimate=parts.estimate,
                       loss=build_policy_loss(cfg), kl=parts.kl, participants=participants, producer=producer,
                       watchdog=watchdog)


def reports(cfg: Config, task: Task) -> list[Participant]:
    """The participants that report on the step's rollouts: a mixture's sources, the groups skipped
    for a failed reward, staleness, the tokens generated so far."""
    return [part for part in (SourceMetrics() if is_mixture(task) else None,
                              SkippedGroups() if cfg.reward.on_error == "skip_group" else None,
                              Staleness() if cfg.rollout.max_staleness or cfg.rollout.partial else None,
                              GeneratedTokens())
            if part is not None]


def build_producer(cfg: Config, task: Task, engine: RolloutEngine, reward_fn: WeightedReward,
                   sampling: SamplingParams, observers: Participants, *, sampler: ProblemSampler,
                   budget: PassRateBudget | None, phase: Callable[[str], AbstractContextManager[None]],
                   ) -> RolloutProducer:
    """The producer of every step's rollouts on `engine`: problems from `sampler`, samples per problem
    from `budget` (an adaptive budget; None: rollout.group_size each), each round's groups observed by
    `observers`; its generate and reward phases are watched by `phase` (the hang watchdog's)."""
    s = cfg.sampling
    production = Production(prompts_per_step=cfg.rollout.prompts_per_step, sampling=sampling, seed=cfg.run.seed,
                            last_step=cfg.train.steps, stages=parse_stages(s.stages),
                            keep=DYNAMIC_KEEP[s.dynamic_keep] if s.dynamic else None,
                            max_rounds=s.max_rounds if s.dynamic else 1, on_error=cfg.reward.on_error,
                            max_staleness=cfg.rollout.max_staleness, partial=cfg.rollout.partial,
                            max_partial_versions=cfg.rollout.max_partial_versions)
    return RolloutProducer(engine, task.train, reward_fn, production, sampler=sampler, observer=observers,
                           budget=budget, phase=phase)


def is_mixture(task: Task) -> bool:
    """Whether the task's problems come from several metadata["source"]s (reported apart)."""
    return len({str(p.metadata.get("source")) for p in (*task.train, *task.test)}) > 1


def _evaluate(run: TrainingRun, logger: RunLogger, step: int) -> dict[str, float]:
    """Evaluate on the task's held-out problems (cfg.eval) and log the metrics at `step`."""
    cfg = run.cfg
    metrics = evaluate(run.engine, run.task.test[: cfg.eval.problems], run.reward_fn,
                       temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
                       samples=cfg.eval.samples, greedy=cfg.eval.greedy,
                       max_new_tokens=cfg.rollout.max_new_tokens, stop=cfg.rollout.stop,
                       seed=derive_seed(cfg.run.seed, "eval"), progress=cfg.run.progress,
                       on_error=cfg.reward.on_error, per_source=is_mixture(run.task))
    logger.log(step, metrics)
    return metrics


def _save_checkpoint(run: TrainingRun, step: int) -> Path:
    """Every stateful part's state, taken with production at rest, and the policy."""
    with run.producer.idle():
        # A reference reset to a past policy is not reproducible from the config: it is saved too.
        state = trainer_state(run.stateful, run.ref_model if run.cfg.algo.ref_reset_every else None,
                              optimizer=run.cfg.run.save_optimizer)
    with run.watchdog.phase("checkpoint"):
        return save_checkpoint(run.run_dir, step, model=run.policy, tokenizer=run.tokenizer,
                               keep=run.cfg.run.keep_checkpoints, state=state)


def _advantages(batch: TrainBatch | None) -> list[float] | None:
    """Each sequence's mean advantage over its loss tokens (logged with its rollout); None without an update."""
    if batch is None:
        return None
    return [float(a) for a in batch.advantages_NT.sum(1) / batch.loss_mask_NT.sum(1).clamp(min=1)]


def _perf_metrics(rollouts: Rollouts, started: float, generated: float, finished: float,
                  sync_s: float) -> dict[str, float]:
    """A step's seconds: generation and scoring (spent by the producer, in the background with async
    rollouts), everything after the step's rollouts arrived (`update_s`: advantages, the update, the
    weight sync), and of that the sync alone."""
    return {"perf/step_s": finished - started, "perf/generate_s": rollouts.generate_s,
            "perf/score_s": rollouts.score_s, "rollout/generated_tokens": rollouts.tokens,
            "perf/update_s": finished - generated, "perf/sync_s": sync_s,
            "perf/tokens_per_s": rollouts.tokens / max(rollouts.generate_s, 1e-9)}
