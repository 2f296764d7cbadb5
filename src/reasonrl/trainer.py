"""The RL loop: sample problems -> generate -> score -> advantages -> update -> sync weights ->
log -> evaluate -> checkpoint. One readable function; what varies between algorithms lives in
the parts it calls (reasonrl.algo, reasonrl.rewards, the engine), chosen by name in the config.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers.utils import logging as transformers_logging

from reasonrl.algo.advantages import ADVANTAGES
from reasonrl.algo.aggregation import AGGREGATIONS
from reasonrl.algo.kl import KL_ESTIMATORS
from reasonrl.algo.objectives import OBJECTIVES
from reasonrl.checkpoint import checkpoints, latest_checkpoint, load_policy_weights, load_trainer_state, save_checkpoint
from reasonrl.config import Config
from reasonrl.eval import CORRECT, evaluate, summarize
from reasonrl.learner import Learner, OptimConfig, PolicyLoss, make_train_batch
from reasonrl.logging import RunLogger
from reasonrl.models import load_model, load_tokenizer, pick_device, resolve_dtype, with_lora
from reasonrl.registry import lookup
from reasonrl.rewards import FormatReward, MathReward, WeightedReward, build_reward, score_groups
from reasonrl.rollout import HFEngine
from reasonrl.runtime import keep_freed_memory
from reasonrl.sampling import EpochSampler
from reasonrl.tasks import Task, arithmetic_task
from reasonrl.types import Group, RewardFn, SamplingParams

UserReward = RewardFn | Mapping[str, tuple[RewardFn, float]]


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
    cfg = replace(cfg, run=replace(cfg.run, dir=time.strftime(cfg.run.dir)))
    run_dir = Path(cfg.run.dir)
    resume_from = _checkpoint_to_resume(cfg)
    device = pick_device(cfg.run.device)
    if device.type == "cpu" and cfg.run.keep_freed_memory:
        keep_freed_memory()
    torch.manual_seed(cfg.run.seed)
    task = task or build_task(cfg)
    reward_fn = build_weighted_reward(cfg, reward)

    tokenizer, policy, engine, ref_model = build_models(cfg, device, resume_from)
    learner = build_learner(cfg, policy, device)
    sampler = EpochSampler(len(task.train), seed=cfg.run.seed)
    step = _restore_state(resume_from, learner, sampler)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.save(run_dir / "config.toml")
    logger = RunLogger(run_dir, tensorboard=cfg.run.tensorboard, resume_step=step if resume_from else None)
    loss = build_policy_loss(cfg)
    advantage_fn = lookup(ADVANTAGES, cfg.algo.advantage, "advantage estimator")
    sampling = SamplingParams(n=cfg.rollout.group_size, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                              top_k=cfg.rollout.top_k, max_new_tokens=cfg.rollout.max_new_tokens, stop=cfg.rollout.stop)

    def run_eval(at_step: int) -> dict[str, float]:
        metrics = evaluate(engine, task.test[: cfg.eval.problems], reward_fn, temperature=cfg.rollout.temperature,
                           samples=cfg.eval.samples, greedy=cfg.eval.greedy, max_new_tokens=cfg.rollout.max_new_tokens,
                           stop=cfg.rollout.stop, seed=derive_seed(cfg.run.seed, "eval"),
                           progress=cfg.run.progress)
        logger.log(at_step, metrics)
        return metrics

    eval_before = run_eval(step) if cfg.eval.before and step == 0 and cfg.eval.problems else None
    bar = tqdm(total=cfg.train.steps, initial=step, desc="train", unit="step", disable=not cfg.run.progress)
    while step < cfg.train.steps:
        started = time.perf_counter()
        problems = [task.train[i] for i in sampler.next(cfg.rollout.prompts_per_step)]
        groups = engine.generate(problems, replace(sampling, seed=derive_seed(cfg.run.seed, step)))
        generated = time.perf_counter()
        groups = score_groups(groups, reward_fn)
        rewards_BG = torch.tensor([group.rewards for group in groups])
        advantages = advantage_fn(rewards_BG, **_accepted(advantage_fn, eps=cfg.algo.adv_eps)).flatten().tolist()
        batch = make_train_batch(groups, advantages, engine.pad_id)
        metrics = learner.update(batch, loss, epochs=cfg.train.ppo_epochs, mini_batches=cfg.train.mini_batches,
                                 micro_batch_size=cfg.train.micro_batch_size, ref_model=ref_model, step=step)
        engine.load_weights(learner.named_weights())
        step += 1
        metrics.update(_rollout_metrics(groups, rewards_BG))
        finished = time.perf_counter()
        new_tokens = sum(len(c.token_ids) for g in groups for c in g.completions)
        metrics.update({"perf/step_s": finished - started, "perf/generate_s": generated - started,
                        "perf/update_s": finished - generated, "perf/tokens_per_s": new_tokens / (generated - started)})
        logger.log(step, metrics)
        logger.log_rollouts(step, groups, advantages)
        accuracy = {"acc": f"{metrics[f'reward/{CORRECT}']:.2f}"} if f"reward/{CORRECT}" in metrics else {}
        bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", **accuracy, tok_s=f"{metrics['perf/tokens_per_s']:.0f}")
        bar.update()
        if cfg.run.log_every and step % cfg.run.log_every == 0:
            tqdm.write(_format_step(step, metrics))
        if cfg.eval.every and step % cfg.eval.every == 0 and step < cfg.train.steps and cfg.eval.problems:
            _report_eval(run_eval(step), step)
        if step == cfg.train.steps or (cfg.run.save_every and step % cfg.run.save_every == 0):
            save_checkpoint(run_dir, step, model=policy, tokenizer=tokenizer, keep=cfg.run.keep_checkpoints,
                            state={"learner": learner.state_dict(), "sampler": sampler.state_dict()})
    bar.close()
    eval_after = run_eval(step) if cfg.eval.problems else None
    _report_eval(eval_after, step, eval_before)
    logger.close()
    return TrainResult(run_dir=run_dir, steps=step, eval_before=eval_before, eval_after=eval_after)


def build_models(cfg: Config, device: torch.device, resume_from: Path | None) -> tuple[Any, Any, HFEngine, Any]:
    """Tokenizer, trainable policy (float32, LoRA-wrapped if asked, restored from a
    checkpoint), the rollout engine on its own copy, and the frozen reference (if KL is on)."""
    transformers_logging.disable_progress_bar()  # its bars would interleave with ours
    tokenizer = load_tokenizer(cfg.model.name)
    policy = load_model(cfg.model.name, dtype=torch.float32, device=device)
    if cfg.train.lora_rank:
        policy = with_lora(policy, rank=cfg.train.lora_rank, alpha=cfg.train.lora_alpha)
    if resume_from is not None:
        load_policy_weights(policy, resume_from)
    if cfg.train.gradient_checkpointing:
        policy.activation_checkpointing_enable({"use_reentrant": False})
    engine = HFEngine(copy.deepcopy(policy).to(resolve_dtype(cfg.rollout.dtype, device)), tokenizer,
                      chat_template=cfg.model.chat_template, fused=cfg.rollout.fused)
    ref_model = None
    if cfg.algo.kl_coef > 0:
        ref_model = _frozen(load_model(cfg.model.name, dtype=torch.float32, device=device))
    return tokenizer, policy, engine, ref_model


def build_learner(cfg: Config, policy: Any, device: torch.device) -> Learner:
    t = cfg.train
    autocast = resolve_dtype(t.dtype, device)
    return Learner(policy, OptimConfig(lr=t.lr, betas=(t.beta1, t.beta2), weight_decay=t.weight_decay,
                                      grad_clip=t.grad_clip, warmup_steps=t.warmup_steps),
                   temperature=cfg.rollout.temperature,
                   autocast_dtype=autocast if autocast != torch.float32 else None, seed=cfg.run.seed)


def _restore_state(resume_from: Path | None, learner: Learner, sampler: EpochSampler) -> int:
    """The step to continue from (0 for a new run), with optimizer and sampler restored."""
    if resume_from is None:
        return 0
    state = load_trainer_state(resume_from)
    learner.load_state_dict(state["learner"])
    sampler.load_state_dict(state["sampler"])
    return state["step"]


def derive_seed(*parts: object) -> int:
    """A stable 63-bit seed from (run seed, step, ...), the same in every process."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def build_task(cfg: Config) -> Task:
    t = cfg.task
    if t.name == "arithmetic":
        return arithmetic_task(train_size=t.train_size, test_size=t.test_size, digits=t.digits, operands=t.operands,
                               seed=cfg.run.seed, prompt_template=t.prompt_template)
    return Task.from_records(t.train_path, t.test_path or None, prompt_field=t.prompt_field,
                             answer_field=t.answer_field, prompt_template=t.prompt_template,
                             test_size=t.test_size, name=Path(t.train_path).stem)


def build_weighted_reward(cfg: Config, user_reward: UserReward | None = None) -> WeightedReward:
    if isinstance(user_reward, Mapping):
        return WeightedReward(user_reward)
    if user_reward is not None:
        return WeightedReward({"reward": (user_reward, 1.0)})
    r = cfg.reward
    components: dict[str, tuple[RewardFn, float]] = {}
    gate_format = bool(r.format_weight) and r.format_gated
    if r.correct_weight or gate_format:  # a gate is scored (and logged) even at weight 0
        components[CORRECT] = (MathReward(extract=r.extract), r.correct_weight)
    if r.format_weight:
        components["format"] = (FormatReward(style=r.format_style), r.format_weight)
    if r.custom:
        components["custom"] = (build_reward(r.custom), r.custom_weight)
    if not components:
        raise ValueError("every reward weight is 0: set reward.correct_weight, reward.format_weight or reward.custom")
    return WeightedReward(components, gates={"format": CORRECT} if gate_format else None)


def build_policy_loss(cfg: Config) -> PolicyLoss:
    a = cfg.algo
    objective = lookup(OBJECTIVES, a.objective, "objective")
    return PolicyLoss(objective=objective, objective_kwargs=_accepted(objective, clip_low=a.clip_low, clip_high=a.clip_high),
                      aggregation=lookup(AGGREGATIONS, a.aggregation, "aggregation"),
                      kl_estimator=KL_ESTIMATORS[a.kl_estimator], kl_coef=a.kl_coef)


def _accepted(fn: Callable[..., Any], **candidates: Any) -> dict[str, Any]:
    """The hyper-parameters among `candidates` that `fn` takes (estimators differ in knobs)."""
    parameters = inspect.signature(fn).parameters
    return {name: value for name, value in candidates.items() if name in parameters}


def _checkpoint_to_resume(cfg: Config) -> Path | None:
    if cfg.run.resume:
        found = latest_checkpoint(cfg.run.dir)
        if found is None:
            raise FileNotFoundError(f"run.resume=true but {cfg.run.dir} has no checkpoint to resume from")
        return found
    if checkpoints(cfg.run.dir):
        raise FileExistsError(f"{cfg.run.dir} already holds checkpoints: continue it with run.resume=true, "
                              "or choose a new run.dir")
    return None


def _frozen(model: Any) -> Any:
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def _rollout_metrics(groups: list[Group], rewards_BG: torch.Tensor) -> dict[str, float]:
    metrics = {}
    for key, value in summarize(groups, "").items():
        if key in ("len_mean", "truncated_frac"):
            metrics[f"rollout/{key}"] = value
        else:
            metrics[f"reward/{key.removeprefix('reward_')}"] = value
    metrics["reward/std"] = rewards_BG.std().item() if rewards_BG.numel() > 1 else 0.0
    metrics["rollout/zero_std_frac"] = (rewards_BG.std(dim=1) == 0).float().mean().item() if rewards_BG.shape[1] > 1 else 1.0
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
