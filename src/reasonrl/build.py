"""From a Config to the objects the training loop runs: task, reward, tokenizer, policy, rollout
engine, reference model, learner, critic, policy loss and advantage estimation. Each is chosen
by name in the config (reasonrl.registry) or passed in by the user."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging as transformers_logging

from reasonrl.agents import (
    ENVIRONMENTS,
    OBSERVATION_TEMPLATES,
    TURN_STOPS,
    AgentEngine,
    EpisodeReward,
    EpisodeStatistic,
    TurnRewards,
)
from reasonrl.algo.advantages import ADVANTAGES, is_token_level
from reasonrl.algo.aggregation import AGGREGATIONS
from reasonrl.algo.kl import KL_ESTIMATORS
from reasonrl.algo.objectives import OBJECTIVES, TOKEN_SELECTIONS
from reasonrl.config import Config, TaskConfig
from reasonrl.models import (
    copy_weights,
    is_lora,
    load_model,
    load_tokenizer,
    load_value_model,
    pick_device,
    resolve_dtype,
    resolve_model_path,
    with_lora,
)
from reasonrl.registry import import_object, is_import_path, lookup
from reasonrl.rewards import (
    VERIFIERS,
    CosineLengthReward,
    FormatReward,
    MathReward,
    RepetitionPenalty,
    RoutedReward,
    SelfCertaintyReward,
    SequenceLogProbReward,
    SoftOverlongPunishment,
    WeightedReward,
    build_reward,
    score_groups,
)
from reasonrl.rewards.compose import is_group_reward
from reasonrl.rewards.judge import ClassifierReward, JudgeReward
from reasonrl.rewards.math import PooledMathReward
from reasonrl.rewards.process import ProcessReward, load_process_model
from reasonrl.rollout import HFEngine
from reasonrl.rollout.choice import build_engine
from reasonrl.rollout.openai import OpenAIEngine
from reasonrl.sampling import BandSampler, CompetenceCurriculum, EpochSampler, PassRateCurriculum
from reasonrl.spec import arguments, spec_of
from reasonrl.tasks import (
    BENCHMARKS,
    HUMANEVAL_SIZE,
    HUMANEVAL_TEMPLATE,
    EnvironmentReward,
    Task,
    arithmetic_task,
    benchmark_task,
    environment_from_spec,
    environment_task,
    humaneval_task,
)
from reasonrl.tasks.environments import leveled_environment_task
from reasonrl.training import checkpointing
from reasonrl.training.checkpoint import load_policy_weights
from reasonrl.training.critic import Critic
from reasonrl.training.estimation import AdvantageEstimation
from reasonrl.training.learner import Learner, OptimConfig, PolicyLoss
from reasonrl.training.prime import ImplicitPRM, PrimeEstimation
from reasonrl.training.teachers import DistilledEstimation, LocalTeacher, ServedTeacher, Teacher, teacher_checkpoint
from reasonrl.types import CORRECT, GroupReward, Problem, RewardFn, SamplingParams

UserReward = RewardFn | GroupReward | Mapping[str, tuple[RewardFn | GroupReward, float]]
Sampler = EpochSampler | BandSampler | CompetenceCurriculum | PassRateCurriculum


def build_estimation(cfg: Config, learner: Learner, *, ref_model: Any, engine: HFEngine, reward_fn: WeightedReward,
                     sampling: SamplingParams, device: torch.device) -> AdvantageEstimation:
    """The advantage estimator of cfg.algo with what it needs: a critic for GAE (built here),
    greedy completions for ReMax, the reference for a KL penalty in the reward."""
    estimator = lookup(ADVANTAGES, cfg.algo.advantage, "advantage estimator")
    critic = build_critic(cfg, device) if "values_NT" in spec_of(estimator).inputs else None

    def greedy_rewards(problems: list[Problem]) -> list[float]:
        greedy = engine.generate(problems, replace(sampling, n=1, temperature=0.0))
        return [group.rewards[0] for group in score_groups(greedy, reward_fn)]

    a = cfg.algo
    return AdvantageEstimation(estimator, learner, cfg.train.micro_batch_size, knobs=arguments(estimator, cfg.value),
                               kl_estimator=KL_ESTIMATORS[a.kl_estimator], kl_in_reward=a.kl_in == "reward",
                               ref_model=ref_model, critic=critic, greedy_rewards=greedy_rewards,
                               mask_truncated=cfg.sampling.mask_truncated, reward_weights=reward_fn.weights,
                               returns_knobs={"gamma": a.gamma, "lam": a.lam})


def build_distillation(cfg: Config, estimate: AdvantageEstimation, *, device: torch.device, run_dir: Path,
                       student_tokenizer: Any) -> AdvantageEstimation | DistilledEstimation:
    """`estimate` followed by the teacher's per-token reverse KL (cfg.distill), when a teacher is set."""
    d = cfg.distill
    if not d.teacher:
        if d.reward_weight == 0:
            raise ValueError("distill.reward_weight=0 trains on the teacher's signal alone, but distill.teacher is "
                             "not set: name a teacher (e.g. `reasonrl distill --teacher MODEL`)")
        return estimate
    teacher = build_teacher(cfg, device, run_dir)
    teacher.check_tokenizer(student_tokenizer)
    return DistilledEstimation(estimate, teacher, weight=d.weight, reward_weight=d.reward_weight)


def build_prime(cfg: Config, estimate: AdvantageEstimation, *, ref_model: Any,
                device: torch.device) -> AdvantageEstimation | PrimeEstimation:
    """`estimate` with PRIME's advantages (cfg.prime) when enabled: the implicit PRM a fresh copy of the
    start model, its reference the run's (when it stays the start model) or another frozen copy."""
    p, t = cfg.prime, cfg.train
    if not p.enabled:
        return estimate
    if ref_model is None or cfg.algo.ref_reset_every:
        ref_model = build_reference(cfg, device)
    autocast = resolve_dtype(t.dtype, device)
    prm = ImplicitPRM(load_model(cfg.model.name, dtype=torch.float32, device=device), ref_model,
                      OptimConfig(lr=p.lr, betas=(t.beta1, t.beta2), weight_decay=0.0, grad_clip=t.grad_clip),
                      beta=p.beta, micro_batch_size=t.micro_batch_size, seed=cfg.run.seed,
                      autocast_dtype=autocast if autocast != torch.float32 else None)
    return PrimeEstimation(estimate, prm, process_weight=p.process_weight, outcome_weight=p.outcome_weight,
                           process_baseline=p.process_baseline, reward_last_token=p.reward_last_token,
                           whiten=p.whiten)


def build_teacher(cfg: Config, device: torch.device, run_dir: Path) -> Teacher:
    """The teacher cfg.distill.teacher names: served (a URL), the policy's start ('self'), a checkpoint
    of this run (self:STEP), or a model."""
    d = cfg.distill
    if d.teacher.startswith(("http://", "https://")):
        return ServedTeacher(d.teacher, model=d.served_model, request_size=d.request_size)
    if d.teacher == "self":
        name = cfg.model.name
    elif d.teacher.startswith("self:"):
        name = str(teacher_checkpoint(d.teacher, run_dir))
    else:
        name = d.teacher
    model = _frozen(load_model(name, dtype=resolve_dtype(d.dtype, device), device=device))
    return LocalTeacher(model, load_tokenizer(name), name=d.teacher, micro_batch_size=cfg.train.micro_batch_size)


def build_models(cfg: Config, device: torch.device, resume_from: Path | None, *, reference: bool = True,
                 ) -> tuple[Any, Any, HFEngine | AgentEngine, Any]:
    """Tokenizer, trainable policy (float32, LoRA-wrapped if asked, restored from a
    checkpoint), the rollout engine on its own copy (playing episodes with cfg.agent's
    environment when one is set), and the frozen reference (if KL is on and `reference`: a
    stage without a KL term asks for none)."""
    refuse_unsupported(cfg)
    transformers_logging.disable_progress_bar()  # its bars would interleave with ours
    tokenizer, policy = build_policy(cfg, device, resume_from)
    checkpointing.enable(policy, cfg.train.gradient_checkpointing, cfg.train.micro_batch_positions)
    ref_model = build_reference(cfg, device) if reference and cfg.algo.kl_coef > 0 else None
    if cfg.run.backend == "ray":
        return tokenizer, policy, build_ray_engine(cfg, policy, device), ref_model
    engine = build_engine(cfg, policy, tokenizer, device)
    return tokenizer, policy, build_agent_engine(cfg, engine) if cfg.agent.environment else engine, ref_model


def build_sampling(cfg: Config) -> SamplingParams:
    """The training rollouts' sampling settings (each step sets its own seed)."""
    r = cfg.rollout
    return SamplingParams(n=r.group_size, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=r.max_new_tokens, stop=r.stop)


def refuse_unsupported(cfg: Config) -> None:
    """Combinations of knobs that cannot work, refused before anything is loaded."""
    if cfg.rollout.engine == "openai":
        raise ValueError("rollout.engine=openai samples a served model that training cannot update (its weights do "
                         "not follow the learner), and the API returns neither the sampled token ids nor their "
                         "log-probs: train with rollout.engine=hf or vllm; evaluate the served model with `reasonrl "
                         "eval --config CONFIG MODEL`")
    if cfg.run.learner_shard and cfg.train.lora_rank:
        raise ValueError("run.learner_shard trains every weight: it does not combine with train.lora_rank (the "
                         "adapters are small; the replicated data-parallel learner trains them)")
    if cfg.run.backend == "ray" and cfg.agent.environment:
        raise ValueError("agent environments run with run.backend=local (the Ray workers hold plain engines)")
    if cfg.rollout.max_staleness:
        if cfg.algo.advantage == "remax":
            raise ValueError("algo.advantage=remax generates its greedy baseline with the rollout engine while the "
                             "learner trains: use rollout.max_staleness=0")
        if cfg.reward.confidence in ("self_certainty", "neg_entropy"):
            raise ValueError(f"reward.confidence={cfg.reward.confidence} runs the policy being trained on each "
                             "sample: use rollout.max_staleness=0, or confidence=sequence_logprob")


def build_ray_engine(cfg: Config, policy: Any, device: torch.device) -> Any:
    """cfg.run.ray_workers hf engines in Ray actors, holding the policy's current weights."""
    from reasonrl.distributed.ray import HFEngineFactory, RayRolloutEngine

    r = cfg.run
    dtype = str(resolve_dtype(cfg.rollout.dtype, device)).removeprefix("torch.")
    factory = HFEngineFactory(cfg.model.name, dtype=dtype, device="cuda" if r.ray_gpus_per_worker > 0 else "cpu",
                              chat_template=cfg.model.chat_template, fused=cfg.rollout.fused,
                              cuda_graphs=cfg.rollout.cuda_graphs,
                              lora_rank=cfg.train.lora_rank, lora_alpha=cfg.train.lora_alpha)
    engine = RayRolloutEngine(factory, workers=r.ray_workers, cpus_per_worker=r.ray_cpus_per_worker,
                              gpus_per_worker=r.ray_gpus_per_worker, threads_per_worker=r.ray_threads_per_worker,
                              address=r.ray_address or None)
    # The workers load the model from its name: the trained weights (a resumed checkpoint, LoRA
    # adapters with their random initialisation) come from the policy.
    engine.load_weights((name, p.detach()) for name, p in policy.named_parameters() if p.requires_grad)
    return engine


def build_policy(cfg: Config, device: torch.device, resume_from: Path | None) -> tuple[Any, Any]:
    """The tokenizer and the trainable policy: float32, LoRA-wrapped if asked, restored from a checkpoint."""
    tokenizer = load_tokenizer(cfg.model.name)
    policy = load_model(cfg.model.name, dtype=torch.float32, device=device)
    if cfg.train.lora_rank:
        policy = with_lora(policy, rank=cfg.train.lora_rank, alpha=cfg.train.lora_alpha)
    if resume_from is not None:
        load_policy_weights(policy, resume_from)
    return tokenizer, policy


def build_agent_engine(cfg: Config, engine: HFEngine) -> AgentEngine:
    """`engine` playing episodes against cfg.agent.environment (a fresh environment per episode)."""
    a = cfg.agent
    if is_import_path(a.environment):
        make_environment = import_object(a.environment)
    else:
        factory = ENVIRONMENTS[a.environment]
        options = arguments(factory, cfg.value)
        if "verifier" in spec_of(factory).inputs:
            verifier = build_verifier(cfg)
            if is_group_reward(verifier):
                raise ValueError(f"agent.environment={a.environment} scores each final answer alone; reward.verifier="
                                 f"{cfg.reward.verifier!r} scores whole groups: use math or code")
            options["verifier"] = verifier
        make_environment = factory(**options)
    return AgentEngine(engine, make_environment, max_turns=a.max_turns, max_episode_tokens=a.max_episode_tokens,
                       max_observation_tokens=a.max_observation_tokens, turn_stops=TURN_STOPS[a.tool_format],
                       observation_template=a.observation_template or OBSERVATION_TEMPLATES[a.tool_format],
                       workers=a.workers)


def build_reference(cfg: Config, device: torch.device) -> Any:
    """The frozen starting policy (the KL penalty's and DPO's reference)."""
    return _frozen(load_model(cfg.model.name, dtype=torch.float32, device=device))


def build_learner(cfg: Config, policy: Any, device: torch.device, learner_class: type[Learner] = Learner, *,
                  temperature: float | None = None) -> Any:
    """The policy's learner: in this process, or with run.learner_workers > 0 (backend=ray) a
    proxy to that many data-parallel learner ranks in Ray actors (this one kept for the no-grad
    log-probs and the weights the engine and the checkpoints read). Its log-probs are taken at
    `temperature`, by default rollout.temperature, that of the samples it trains on."""
    t = cfg.train
    temperature = cfg.rollout.temperature if temperature is None else temperature
    autocast = resolve_dtype(t.dtype, device)
    learner = learner_class(policy, OptimConfig(lr=t.lr, betas=(t.beta1, t.beta2), weight_decay=t.weight_decay,
                                                grad_clip=t.grad_clip, warmup_steps=t.warmup_steps),
                            temperature=temperature, pack=t.pack_sequences,
                            micro_batch_positions=t.micro_batch_positions,
                            autocast_dtype=autocast if autocast != torch.float32 else None, seed=cfg.run.seed)
    if cfg.run.backend == "ray" and cfg.run.learner_workers and learner_class is Learner:
        from reasonrl.distributed.ray import LearnerFactory, RayLearner

        r = cfg.run
        return RayLearner(learner, LearnerFactory(partial(build_learner_rank, cfg, temperature=temperature),
                                                  device="cuda" if r.ray_gpus_per_learner > 0 else "cpu",
                                                  threads=r.ray_threads_per_worker),
                          workers=r.learner_workers, cpus_per_worker=r.ray_cpus_per_learner,
                          gpus_per_worker=r.ray_gpus_per_learner)
    return learner


def build_supervised_learner(cfg: Config, policy: Any, device: torch.device) -> Any:
    """The learner of a stage that trains on given targets (SFT, DPO, RFT): they are not samples of a
    temperature, so the likelihood is the model's own (temperature 1)."""
    return build_learner(cfg, policy, device, temperature=1.0)


def build_learner_rank(cfg: Config, device: torch.device, weights: dict[str, torch.Tensor], *,
                       temperature: float | None = None) -> Learner:
    """A data-parallel learner rank (built inside its Ray actor) whose trainable weights are
    `weights`, the driver's, set before FSDP shards them; its log-probs at `temperature` (build_learner)."""
    from reasonrl.distributed.data_parallel import DataParallelLearner

    _, policy = build_policy(cfg, device, None)
    copy_weights(policy, weights.items())
    checkpointing.enable(policy, cfg.train.gradient_checkpointing, cfg.train.micro_batch_positions)
    return build_learner(cfg, policy, device, learner_class=partial(DataParallelLearner, shard=cfg.run.learner_shard),
                         temperature=temperature)


def build_critic(cfg: Config, device: torch.device) -> Critic:
    c, t = cfg.critic, cfg.train
    autocast = resolve_dtype(t.dtype, device)
    return Critic(load_value_model(c.model or cfg.model.name, device=device),
                  OptimConfig(lr=c.lr, betas=(t.beta1, t.beta2), weight_decay=c.weight_decay, grad_clip=t.grad_clip,
                              warmup_steps=t.warmup_steps),
                  value_clip=c.value_clip, autocast_dtype=autocast if autocast != torch.float32 else None,
                  seed=cfg.run.seed, pack=t.pack_sequences, micro_batch_positions=t.micro_batch_positions)


def merged_state_dict(policy: Any) -> dict[str, torch.Tensor]:
    """The policy's weights as a plain model's state dict (LoRA adapters merged in)."""
    if is_lora(policy):
        return copy.deepcopy(policy).merge_and_unload().state_dict()
    return policy.state_dict()


def build_task(cfg: Config) -> Task:
    t = cfg.task
    if t.name == "arithmetic":
        return arithmetic_task(train_size=t.train_size, test_size=t.test_size, digits=t.digits, operands=t.operands,
                               seed=cfg.run.seed, prompt_template=t.prompt_template)
    if t.name == "humaneval":
        held_out = min(t.test_size, HUMANEVAL_SIZE)
        template = t.prompt_template if t.prompt_template != TaskConfig.prompt_template else HUMANEVAL_TEMPLATE
        return humaneval_task(train_size=HUMANEVAL_SIZE - held_out, prompt_template=template)
    if t.name in BENCHMARKS:
        has_train = BENCHMARKS[t.name].has_train
        return benchmark_task(t.name, data_dir=t.data_dir or None, hub=t.hub, prompt_template=t.prompt_template,
                              train_size=t.train_size if has_train else 0, test_size=t.test_size or None)
    if t.name == "environment" and t.environment_levels:
        levels = json.loads(t.environment_levels)
        if not isinstance(levels, list) or not all(isinstance(level, dict) for level in levels):
            raise ValueError(f"task.environment_levels must be a JSON list of objects, got {t.environment_levels!r}")
        return leveled_environment_task(t.environment, levels, train_size=t.train_size, test_size=t.test_size,
                                        seed=cfg.run.seed, prompt_template=t.prompt_template)
    if t.name == "environment":
        return environment_task(environment_from_spec(t.environment, t.environment_config), train_size=t.train_size,
                                test_size=t.test_size, seed=cfg.run.seed, prompt_template=t.prompt_template)
    return Task.from_records(t.train_path, t.test_path or None, prompt_field=t.prompt_field,
                             answer_field=t.answer_field, prompt_template=t.prompt_template,
                             test_size=t.test_size, name=Path(t.train_path).stem,
                             difficulty_field=t.difficulty_field or None, tag_source=True)


def build_sampler(cfg: Config, task: Task) -> Sampler:
    """The problem sampler of cfg.sampling.problems over `task.train`."""
    s, seed, count = cfg.sampling, cfg.run.seed, len(task.train)
    if s.problems == "shuffle":
        return EpochSampler(count, seed=seed)
    if s.problems == "band":
        return BandSampler(count, low=s.band_low, high=s.band_high, seed=seed, decay=s.pass_rate_decay)
    difficulties = _difficulties(task, s.difficulty_field)
    if s.problems == "competence":
        return CompetenceCurriculum(difficulties, total_steps=cfg.train.steps, initial=s.initial_competence, seed=seed)
    return PassRateCurriculum(difficulties, advance_at=s.advance_at, decay=s.pass_rate_decay, seed=seed)


def _difficulties(task: Task, field_name: str) -> list[float]:
    difficulties = []
    for problem in task.train:
        value = problem.metadata.get(field_name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(  # noqa: TRY004 (a bad value in the task's data, not a wrong argument)
                f"a curriculum orders problems by metadata[{field_name!r}] (sampling.difficulty_field), "
                f"but problem {problem.id!r} has {value!r}; give every training problem a number there")
        difficulties.append(float(value))
    return difficulties


def build_weighted_reward(cfg: Config, user_reward: UserReward | None = None, *, policy: Any = None,
                          prompt_ids_fn: Callable[[Problem], list[int]] | None = None,
                          tokenizer: Any = None) -> WeightedReward:
    """The user's reward, or the components cfg.reward asks for. `policy` and `prompt_ids_fn`
    (the engine's prompt token ids) are needed by the confidence rewards that run the policy,
    the policy's `tokenizer` by a process reward (to find each step's last token)."""
    if isinstance(user_reward, Mapping):
        return WeightedReward(user_reward)
    if user_reward is not None:
        return WeightedReward({"reward": (user_reward, 1.0)})
    if cfg.agent.environment:
        return _episode_reward(cfg)
    r = cfg.reward
    verifier = build_verifier(cfg)
    primary = CORRECT if r.verifier != "majority_vote" else "majority"
    components: dict[str, tuple[RewardFn | GroupReward, float]] = {}
    gate_format = bool(r.format_weight) and r.format_gated
    if r.cosine_length:
        if is_group_reward(verifier):
            raise ValueError(f"reward.cosine_length needs a verifier that checks one answer at a time; "
                             f"reward.verifier={r.verifier!r} scores whole groups")
        components["cosine"] = (CosineLengthReward(max_length=cfg.rollout.max_new_tokens, correct=verifier),
                                r.correct_weight)
    if r.correct_weight or gate_format or r.cosine_length:  # a gate is scored (and logged) even at weight 0
        components[primary] = (verifier, 0.0 if r.cosine_length else r.correct_weight)
    if primary != CORRECT:  # label-free training: accuracy against the gold answer is still worth watching
        components[CORRECT] = (MathReward(extract=r.extract, timeout_s=r.math_timeout_s), 0.0)
    if r.format_weight:
        components["format"] = (FormatReward(style=r.format_style), r.format_weight)
    if r.custom:
        components["custom"] = (build_reward(r.custom), r.custom_weight)
    if r.overlong_buffer:
        components["overlong"] = (SoftOverlongPunishment(max_length=cfg.rollout.max_new_tokens,
                                                         cache_length=r.overlong_buffer), r.overlong_weight)
    if r.repetition_ngram:
        components["repetition"] = (RepetitionPenalty(ngram_size=r.repetition_ngram), r.repetition_weight)
    if r.confidence:
        components["confidence"] = (_confidence_reward(cfg, policy, prompt_ids_fn), r.confidence_weight)
    if r.judge_model:
        components["judge"] = (build_judge(cfg), r.judge_weight)
    if r.process_model:
        prm = load_process_model(resolve_model_path(r.process_model))
        components["process"] = (ProcessReward(prm, split=r.process_split, aggregate=r.process_aggregate,
                                               gated_by=verifier if r.process_gated else None, tokenizer=tokenizer),
                                 r.process_weight)
    if r.reward_model:
        components["reward_model"] = (ClassifierReward.from_pretrained(resolve_model_path(r.reward_model)),
                                      r.reward_model_weight)
    if not any(weight for _, weight in components.values()):
        raise ValueError("every reward weight is 0: set reward.correct_weight, reward.format_weight or reward.custom")
    return WeightedReward(components, gates={"format": primary} if gate_format else None)


def _episode_reward(cfg: Config) -> WeightedReward:
    """The environment scored each episode as it was played: its total is the reward. The verifier's
    verdict and the tool-use statistics are logged beside it (weight 0) as reward/correct and
    reward/tool/<statistic>; a reward.custom component still adds to the total."""
    # A token-level estimator (e.g. reasonrl.agents.credit:turn_grpo) gets each turn's reward on that turn.
    token_level = is_token_level(lookup(ADVANTAGES, cfg.algo.advantage, "advantage estimator"))
    components: dict[str, tuple[RewardFn | GroupReward, float]] = {
        "episode": (TurnRewards() if token_level else EpisodeReward(), 1.0), CORRECT: (EpisodeStatistic("correct"), 0.0),
        **{f"tool/{name}": (EpisodeStatistic(name), 0.0) for name in ("valid", "invalid", "turns")}}
    if cfg.reward.custom:
        components["custom"] = (build_reward(cfg.reward.custom), cfg.reward.custom_weight)
    return WeightedReward(components)


def build_judge(cfg: Config) -> JudgeReward:
    """The LLM judge of cfg.reward: a served model (judge_url) or a local one, its own engine."""
    r = cfg.reward
    if r.judge_url:
        engine: Any = OpenAIEngine(r.judge_url, r.judge_model)
    else:
        device = pick_device(cfg.run.device)
        engine = HFEngine(load_model(r.judge_model, dtype=resolve_dtype(cfg.rollout.dtype, device), device=device),
                          load_tokenizer(r.judge_model), fused=cfg.rollout.fused, cuda_graphs=cfg.rollout.cuda_graphs)
    return JudgeReward(engine, votes=r.judge_votes, parse=r.judge_parse)


def build_verifier(cfg: Config) -> RewardFn | GroupReward:
    """The reward that scores an answer (cfg.reward.verifier); 'routed' lets each problem name its own."""
    r = cfg.reward

    def verifier(name: str) -> RewardFn | GroupReward:
        if name == "math" and r.math_workers:
            return PooledMathReward(extract=r.extract, workers=r.math_workers, timeout_s=r.math_timeout_s)
        if name == "math":
            return MathReward(extract=r.extract, timeout_s=r.math_timeout_s)
        factory = lookup(VERIFIERS, name, "verifier")
        return factory if is_import_path(name) else factory(**arguments(factory, cfg.value))

    if cfg.task.name == "environment" and r.verifier == "math":  # each environment checks its own answers
        return EnvironmentReward(environment_from_spec(cfg.task.environment, cfg.task.environment_config))
    if r.verifier == "routed":
        return RoutedReward({name: verifier(name) for name in VERIFIERS}, key="verifier", default="math")
    return verifier(r.verifier)


def _confidence_reward(cfg: Config, policy: Any, prompt_ids_fn: Callable[[Problem], list[int]] | None,
                       ) -> GroupReward:
    if cfg.reward.confidence == "sequence_logprob":
        return SequenceLogProbReward()
    if policy is None or prompt_ids_fn is None:
        raise ValueError(f"reward.confidence={cfg.reward.confidence!r} runs the policy: build the reward with the "
                         "policy and the engine's prompt ids")
    return SelfCertaintyReward(model=policy, prompt_ids_fn=prompt_ids_fn, measure=cfg.reward.confidence,
                               temperature=cfg.rollout.temperature)


def build_policy_loss(cfg: Config) -> PolicyLoss:
    """The loss of cfg.algo (its KL coefficient is set per step by the trainer)."""
    a = cfg.algo
    objective = lookup(OBJECTIVES, a.objective, "objective")
    aggregation = lookup(AGGREGATIONS, a.aggregation, "aggregation")
    selection = TOKEN_SELECTIONS.get(a.objective)
    return PolicyLoss(objective=objective, objective_kwargs=arguments(objective, cfg.value), aggregation=aggregation,
                      aggregation_kwargs=arguments(aggregation, cfg.value),
                      kl_estimator=KL_ESTIMATORS[a.kl_estimator], kl_coef=a.kl_coef, entropy_coef=a.entropy_coef,
                      tis_level=tis_level(cfg), tis_cap=a.tis_cap, mis_level="" if a.mis == "off" else a.mis,
                      mis_low=a.mis_low, mis_high=a.mis_high, token_selection=selection,
                      selection_kwargs=arguments(selection, cfg.value) if selection else {})


def tis_level(cfg: Config) -> str:
    """The truncated importance sampling level ('' = off); auto: per token when samples may be stale."""
    if cfg.algo.tis == "auto":
        return "token" if cfg.rollout.max_staleness > 0 else ""
    return "" if cfg.algo.tis == "off" else cfg.algo.tis


def _frozen(model: Any) -> Any:
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


