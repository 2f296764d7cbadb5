"""From a Config to the core objects the training loop runs: the task, the reward, the tokenizer,
policy and rollout engine, the reference model, the learner, the policy loss and the advantage
estimation; then what each method adds to them (`build_methods`: reasonrl.methods.METHODS, walked
in order). Each part is chosen by name in the config (a registry: reasonrl.tasks.TASKS, the reward's
components, reasonrl.sampling.SAMPLERS, reasonrl.algo's) or passed in by the user."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging as transformers_logging

from reasonrl import methods
from reasonrl.agents import ENVIRONMENTS, OBSERVATION_TEMPLATES, TURN_STOPS, AgentEngine
from reasonrl.agents.openai_agents import AgentReward, OpenAIAgentEngine
from reasonrl.agents.openenv import OBSERVATION_TEMPLATE as OPENENV_OBSERVATION_TEMPLATE
from reasonrl.agents.openenv import openenv_environments
from reasonrl.agents.verifiers_episodes import VerifiersEpisode
from reasonrl.algo.advantages import ADVANTAGES
from reasonrl.algo.aggregation import AGGREGATIONS
from reasonrl.algo.kl import KL_ESTIMATORS
from reasonrl.algo.objectives import OBJECTIVES, TOKEN_SELECTIONS
from reasonrl.config import Config, ConfigError
from reasonrl.config.applicability import replaced_by_own_reward, tis_level
from reasonrl.config.consistency import refuse_unsupported
from reasonrl.methods import RunParts
from reasonrl.models import frozen, load_model, load_tokenizer, resolve_dtype, with_lora
from reasonrl.registry import import_object, is_import_path, lookup
from reasonrl.rewards import WeightedReward, build_reward, score_groups
from reasonrl.rewards.components import TASK_REWARDS, RewardInputs, build_verifier, configured_reward, episode_reward
from reasonrl.rewards.compose import is_group_reward
from reasonrl.rewards.format import FORMAT_INSTRUCTIONS
from reasonrl.rewards.math_verify_threads import bound_off_the_main_thread
from reasonrl.rollout import HFEngine
from reasonrl.rollout.choice import build_engine
from reasonrl.sampling import SAMPLERS
from reasonrl.spec import arguments, spec_of
from reasonrl.tasks import TASKS, Task
from reasonrl.tasks.verifiers_env import load_environment, load_tasks, plays_itself
from reasonrl.training import recompute
from reasonrl.training.checkpoint import load_policy_weights
from reasonrl.training.estimation import AdvantageEstimation
from reasonrl.training.jsonl import warn
from reasonrl.training.learner import Learner, OptimConfig, PolicyLoss
from reasonrl.types import GroupReward, Problem, RewardFn, Sampler, SamplingParams

UserReward = RewardFn | GroupReward | Mapping[str, tuple[RewardFn | GroupReward, float]]


def build_task(cfg: Config, task: Task | None = None) -> Task:
    """The task cfg.task names (reasonrl.tasks.TASKS), or `task`, each problem's conversation opened by
    the system message cfg.model asks for (`with_system_message`)."""
    task = task or TASKS[cfg.task.name](cfg.task, cfg.run.seed)
    if not (text := system_message(cfg)):
        return task
    return replace(task, train=with_system_message(task.train, text), test=with_system_message(task.test, text))


def system_message(cfg: Config) -> str:
    """The system message opening every conversation: model.system_prompt, then the instruction of
    model.reasoning_format ('': none)."""
    parts = (cfg.model.system_prompt, FORMAT_INSTRUCTIONS.get(cfg.model.reasoning_format, ""))
    return "\n\n".join(part for part in parts if part)


def with_system_message(problems: Sequence[Problem], text: str) -> list[Problem]:
    """Each problem as a conversation opened by the system message `text` (a text prompt becomes its
    user message, rendered through the chat template as before). A problem already opened by `text`
    is kept as it is; one holding another system message is refused: two would reach the model. No
    `text`: the problems as they are."""
    if not text:
        return list(problems)
    opened, system = [], {"role": "system", "content": text}
    for problem in problems:
        messages = [{"role": "user", "content": problem.prompt}] if isinstance(problem.prompt, str) \
            else list(problem.prompt)
        if messages[:1] == [system] and all(message["role"] != "system" for message in messages[1:]):
            opened.append(problem)
            continue
        if any(message["role"] == "system" for message in messages):
            raise ConfigError(f"problem {problem.id!r} has a system message of its own, and model.system_prompt / "
                              "model.reasoning_format would add a second: leave them unset for this task, or take the "
                              "system message out of its data and set model.system_prompt to it")
        opened.append(replace(problem, prompt=[dict(system), *messages]))
    return opened


def build_models(cfg: Config, device: torch.device, resume_from: Path | None, *, reference: bool = True,
                 ) -> tuple[Any, Any, HFEngine | AgentEngine | OpenAIAgentEngine, Any]:
    """Tokenizer, trainable policy (float32, LoRA-wrapped if asked, restored from a
    checkpoint), the rollout engine on its own copy (behind the front the config turns on, if
    any: ENGINE_FRONTS), and the frozen reference (if KL is on and `reference`: a stage without a
    KL term asks for none)."""
    refuse_unsupported(cfg)
    transformers_logging.disable_progress_bar()  # its bars would interleave with ours
    tokenizer, policy = build_policy(cfg, device, resume_from)
    if cfg.model.chat_template and not getattr(tokenizer, "chat_template", None):
        warn(f"model.chat_template=true, but {cfg.model.name}'s tokenizer has no chat template: prompts go to the "
             "model as plain text (model.chat_template=false says so and silences this)")
    recompute.enable(policy, cfg.train.gradient_checkpointing, cfg.train.micro_batch_positions)
    ref_model = build_reference(cfg, device) if reference and cfg.algo.kl_coef > 0 else None
    if cfg.run.backend == "ray":
        return tokenizer, policy, build_ray_engine(cfg, policy, device), ref_model
    engine = build_engine(cfg, policy, tokenizer, device)
    return tokenizer, policy, build_front(cfg, engine), ref_model


def build_sampling(cfg: Config) -> SamplingParams:
    """The training rollouts' sampling settings (each step sets its own seed)."""
    r = cfg.rollout
    return SamplingParams(n=r.group_size, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=r.max_new_tokens, stop=r.stop)


def build_ray_engine(cfg: Config, policy: Any, device: torch.device) -> Any:
    """cfg.run.ray_workers hf engines in Ray actors, holding the policy's current weights."""
    from reasonrl.distributed.ray import HFEngineFactory, RayRolloutEngine

    r = cfg.run
    dtype = str(resolve_dtype(cfg.rollout.dtype, device)).removeprefix("torch.")
    factory = HFEngineFactory(cfg.model.name, dtype=dtype, device="cuda" if r.ray_gpus_per_worker > 0 else "cpu",
                              chat_template=cfg.model.chat_template, fused=cfg.rollout.fused,
                              cuda_graphs=cfg.rollout.cuda_graphs, max_rows=cfg.rollout.max_batch_rows,
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
                                 f"{cfg.reward.verifier!r} scores whole groups: use reward.verifier=math (without "
                                 "reward.math_workers) or a verifier of your own that checks one answer")
            options["verifier"] = verifier
        make_environment = factory(**options)
    return AgentEngine(engine, make_environment, max_turns=a.max_turns, max_episode_tokens=a.max_episode_tokens,
                       max_observation_tokens=a.max_observation_tokens, turn_stops=TURN_STOPS[a.tool_format],
                       observation_template=a.observation_template or OBSERVATION_TEMPLATES[a.tool_format],
                       workers=a.workers)


def build_openai_agent_engine(cfg: Config, engine: HFEngine) -> OpenAIAgentEngine:
    """`engine` behind the endpoint that cfg.task.agent's episodes call, serving it as model.name."""
    t = cfg.task
    return OpenAIAgentEngine(engine, import_object(t.agent), model_name=cfg.model.name, timeout_s=t.agent_timeout_s,
                             on_error=t.on_error)


def build_environment_engine(cfg: Config, engine: HFEngine) -> HFEngine | AgentEngine | OpenAIAgentEngine:
    """`engine` playing the episodes of task.env's environment: an OpenEnv one's turn by turn (a
    session per episode); a verifiers one that plays its own episodes, behind the endpoint its model
    calls reach; failures contained as task.on_error says. A single-turn verifiers environment's
    episodes are single replies, which `engine` itself samples."""
    a, t = cfg.agent, cfg.task
    if t.name == "verifiers":
        if plays_itself(t.env, t.env_args):
            env, _ = load_environment(t.env, t.env_args)
            episodes = VerifiersEpisode(env, load_tasks(t.env, t.env_args, t.train_size + t.test_size))
            return OpenAIAgentEngine(engine, episodes, model_name=cfg.model.name, timeout_s=t.agent_timeout_s,
                                     on_error=t.on_error)
        if unused := [key for key in ("task.on_error", "task.agent_timeout_s") if cfg.value(key) != Config().value(key)]:
            raise ConfigError(f"{', '.join(unused)}: no effect, since task.env={t.env!r} is single-turn (one reply "
                              f"per episode, sampled here): remove {'them' if len(unused) > 1 else 'it'}")
        return engine
    return AgentEngine(engine, openenv_environments(t), max_turns=a.max_turns, max_episode_tokens=a.max_episode_tokens,
                       max_observation_tokens=a.max_observation_tokens,
                       observation_template=a.observation_template or OPENENV_OBSERVATION_TEMPLATE, workers=a.workers,
                       on_error=t.on_error, env_timeout_s=t.env_timeout_s)


ENGINE_FRONTS: dict[str, Callable[[Config, Any], Any]] = {"agent.environment": build_agent_engine,
                                                          "task.agent": build_openai_agent_engine,
                                                          "task.env_url": build_environment_engine,
                                                          "task.env": build_environment_engine}
"""What wraps the rollout engine to play episodes, by the config key that turns it on (the config
refuses two at once: reasonrl.config.consistency)."""


def build_front(cfg: Config, engine: Any) -> Any:
    """`engine` wrapped by the front whose key `cfg` sets, or `engine` itself."""
    for key, front in ENGINE_FRONTS.items():
        if cfg.value(key):
            return front(cfg, engine)
    return engine


def build_reference(cfg: Config, device: torch.device) -> Any:
    """The frozen starting policy (the KL penalty's and DPO's reference)."""
    return frozen(load_model(cfg.model.name, dtype=torch.float32, device=device))


def build_learner(cfg: Config, policy: Any, device: torch.device, *, temperature: float | None = None,
                  updates_per_step: int | None = None) -> Any:
    """The policy's learner: in this process, or with run.learner_workers > 0 (backend=ray) that many
    data-parallel learner ranks in Ray actors, each built there from the run's settings, this process
    keeping a scorer of its copy of the policy (no optimizer) for the no-grad log-probs and the weights
    the engine and the checkpoints read. Its log-probs are taken at `temperature`, by default
    rollout.temperature, that of the samples it trains on."""
    t, r = cfg.train, cfg.run
    temperature = cfg.rollout.temperature if temperature is None else temperature
    autocast = resolve_dtype(t.dtype, device)
    settings = {"temperature": temperature, "pack": t.pack_sequences, "micro_batch_positions": t.micro_batch_positions,
                "autocast_dtype": autocast if autocast != torch.float32 else None, "seed": cfg.run.seed}
    optim = OptimConfig.of(t, lr=t.lr, weight_decay=t.weight_decay, updates_per_step=updates_per_step)
    if t.lr_schedule != "constant" and 0 < optim.decay_horizon <= t.warmup_steps:
        raise ConfigError(f"train.lr_schedule={t.lr_schedule} decays after the warm-up, but train.warmup_steps="
                          f"{t.warmup_steps} spans the run's {optim.decay_horizon} optimizer steps: shorten the "
                          "warm-up or set train.lr_schedule=constant")
    if not (r.backend == "ray" and r.learner_workers):
        return Learner(policy, optim, **settings)
    from reasonrl.distributed.ray import LearnerRankSpec, RankScorer, RayLearner

    spec = LearnerRankSpec(model=cfg.model.name, optim=optim, temperature=temperature, pack=t.pack_sequences,
                           micro_batch_positions=t.micro_batch_positions, seed=cfg.run.seed,
                           autocast_dtype="" if autocast == torch.float32 else str(autocast).removeprefix("torch."),
                           gradient_checkpointing=t.gradient_checkpointing, shard=r.learner_shard,
                           lora_rank=t.lora_rank, lora_alpha=t.lora_alpha,
                           device="cuda" if r.ray_gpus_per_learner > 0 else "cpu", threads=r.ray_threads_per_worker)
    return RayLearner(RankScorer(policy, world_size=r.learner_workers, **settings), spec, workers=r.learner_workers,
                      cpus_per_worker=r.ray_cpus_per_learner, gpus_per_worker=r.ray_gpus_per_learner)


def build_supervised_learner(cfg: Config, policy: Any, device: torch.device, *, updates_per_step: int = 1) -> Any:
    """The learner of a stage that trains on given targets (SFT, DPO, RFT): they are not samples of a
    temperature, so the likelihood is the model's own (temperature 1)."""
    return build_learner(cfg, policy, device, temperature=1.0, updates_per_step=updates_per_step)


def build_policy_loss(cfg: Config) -> PolicyLoss:
    """The loss of cfg.algo (its KL coefficient is set each step by reasonrl.methods.kl)."""
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


def build_sampler(cfg: Config, task: Task) -> Sampler:
    """The problem sampler of cfg.sampling.problems over `task.train` (reasonrl.sampling.SAMPLERS)."""
    factory = SAMPLERS[cfg.sampling.problems]
    return factory(task.train, **arguments(factory, cfg.value))


def build_weighted_reward(cfg: Config, user_reward: UserReward | None = None, *, policy: Any = None,
                          prompt_ids_fn: Callable[[Problem], list[int]] | None = None,
                          tokenizer: Any = None) -> WeightedReward:
    """The user's reward, an agent environment's episode reward, the reward of an environment that
    scores its own episodes (TASK_REWARDS), or the components cfg.reward asks for
    (reasonrl.rewards.components). `policy` and `prompt_ids_fn` (the engine's prompt token ids)
    are needed by the confidence rewards that run the policy, the policy's `tokenizer` by a process
    reward (to find each step's last token). With task.agent, the reward is the float the agent
    returns for each episode (component 'agent')."""
    bound_off_the_main_thread()  # rewards that score off the main thread (module docstring there)
    if cfg.task.agent:
        if user_reward is not None:
            raise ConfigError("task.agent's episodes are scored by the float the agent returns: pass no reward to "
                              "train(), or return that reward from the agent")
        return WeightedReward({"agent": (AgentReward(), 1.0)})
    if user_reward is not None:
        check_user_reward(cfg, user_reward)
        if isinstance(user_reward, Mapping):
            return WeightedReward(user_reward)
        return WeightedReward({"reward": (user_reward, 1.0)})
    if cfg.reward.fn:
        return WeightedReward({"reward": (build_reward(cfg.reward.fn), 1.0)})
    if cfg.agent.environment:
        return episode_reward(cfg)
    if cfg.task.name in TASK_REWARDS:
        return TASK_REWARDS[cfg.task.name](cfg)
    return configured_reward(cfg, RewardInputs(build_verifier(cfg), policy=policy, prompt_ids_fn=prompt_ids_fn,
                                               tokenizer=tokenizer))


def check_user_reward(cfg: Config, user_reward: UserReward | None) -> None:
    """A reward given in Python is the whole reward, as reward.fn is: the reward knobs it leaves
    without effect are refused rather than ignored (called before anything loads)."""
    if user_reward is None:
        return
    if cfg.reward.fn:
        raise ConfigError(f"the reward is given twice: reward.fn={cfg.reward.fn!r} and train(..., reward=...); "
                          "keep one")
    if replaced := replaced_by_own_reward(cfg):
        listed = ", ".join(f"{key}={cfg.value(key)!r}" for key in replaced)
        raise ConfigError(f"{listed}: no effect, since the reward given to train(..., reward=...) is the whole "
                          "reward. Remove them, or pass a dict of components (name -> (reward, weight))")


def build_estimation(cfg: Config, learner: Learner, *, ref_model: Any, engine: HFEngine, reward_fn: WeightedReward,
                     sampling: SamplingParams) -> AdvantageEstimation:
    """The advantage estimator of cfg.algo with what it needs: greedy completions for ReMax, the
    reference for a KL penalty in the reward (a critic for GAE joins it: reasonrl.methods.critic)."""
    estimator = lookup(ADVANTAGES, cfg.algo.advantage, "advantage estimator")

    def greedy_rewards(problems: list[Problem]) -> list[float]:
        greedy = engine.generate(problems, replace(sampling, n=1, temperature=0.0))
        return [group.rewards[0] for group in score_groups(greedy, reward_fn)]

    a = cfg.algo
    return AdvantageEstimation(estimator, learner, cfg.train.micro_batch_size, knobs=arguments(estimator, cfg.value),
                               kl_estimator=KL_ESTIMATORS[a.kl_estimator], kl_in_reward=a.kl_in == "reward",
                               ref_model=ref_model, greedy_rewards=greedy_rewards,
                               mask_truncated=cfg.sampling.mask_truncated, reward_weights=reward_fn.weights,
                               returns_knobs={"gamma": a.gamma, "lam": a.lam})


def build_methods(cfg: Config, parts: RunParts) -> RunParts:
    """`parts` with what each method of reasonrl.methods.METHODS adds to them, walked in order: each
    sees what the ones before added (the estimation they wrapped, their participants)."""
    for method in methods.METHODS:
        parts = parts.add(method.build(cfg, parts))
    return parts


def update_sizes(cfg: Config) -> dict[str, int]:
    """The epochs, mini-batches and micro-batch size of the policy's update (and the critic's)."""
    return {"epochs": cfg.train.ppo_epochs, "mini_batches": cfg.train.mini_batches,
            "micro_batch_size": cfg.train.micro_batch_size}
