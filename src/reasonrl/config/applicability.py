"""Which knobs a config uses: a knob set to anything but its default that nothing the config chooses
reads is an error, not a silent no-op (`algo.sapo_tau_pos=3` under `algo.objective=ppo_clip`).

Two sources say when a knob applies:
- `FAMILIES`: a key that chooses a function from a registry (`algo.objective`, ...). Each registered
  function declares the knobs it takes (reasonrl.spec); a knob some function of the family declares
  applies only when a function declaring it is chosen. (An objective's token selection comes with it.)
- `GATES`: knobs that only a setting switches on (the KL penalty's estimator with `algo.kl_coef > 0`,
  the guidance knobs with a guidance mode, a critic's with an estimator that reads one, ...).

`inapplicable(cfg)` says, for every knob that does not apply, why; `unused_knobs` keeps those set
away from their default, which `check_consistency` refuses. `reasonrl explain` lists the rest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reasonrl.agents.builtin import ENVIRONMENTS
from reasonrl.algo.advantages import ADVANTAGES
from reasonrl.algo.aggregation import AGGREGATIONS
from reasonrl.algo.objectives import OBJECTIVES, TOKEN_SELECTIONS
from reasonrl.config.knobs import ConfigError
from reasonrl.config.sections import Config
from reasonrl.registry import import_object, is_import_path
from reasonrl.rollout.choice import ENGINES
from reasonrl.spec import spec_of
from reasonrl.tasks.benchmarks import BENCHMARKS


@dataclass(frozen=True)
class Family:
    """A registry chosen by the config key `choice`; `companions` come with an entry of the same name."""

    choice: str
    registry: Mapping[str, Any]
    companions: Mapping[str, Any] = field(default_factory=dict)

    def chosen(self, cfg: Config) -> list[Any]:
        """The functions `cfg` chooses from this family (none for an empty choice)."""
        name = cfg.value(self.choice)
        if not name:
            return []
        if is_import_path(name):
            try:
                return [import_object(name)]
            except ValueError as exc:
                raise ConfigError(f"{self.choice}={name!r}: {exc}") from None
        return [self.registry[name], *([self.companions[name]] if name in self.companions else [])]

    def owned(self) -> dict[str, list[str]]:
        """Each knob some entry of the family declares, with the names of the entries declaring it."""
        owners: dict[str, list[str]] = {}
        for name, fn in self.registry.items():
            keys = spec_of(fn).keys | (spec_of(self.companions[name]).keys if name in self.companions else set())
            for key in sorted(keys):  # one order in every process (a set's follows the hash seed)
                owners.setdefault(key, []).append(name)
        return owners


FAMILIES = (
    Family("algo.advantage", ADVANTAGES),
    Family("algo.objective", OBJECTIVES, TOKEN_SELECTIONS),
    Family("algo.aggregation", AGGREGATIONS),
    Family("agent.environment", ENVIRONMENTS),
    Family("rollout.engine", ENGINES),
)


@dataclass(frozen=True)
class Gate:
    """`keys` apply only when `applies(cfg)`, which `when` says in words."""

    keys: tuple[str, ...]
    when: str
    applies: Callable[[Config], bool]


def _uses_critic(cfg: Config) -> bool:
    chosen = FAMILIES[0].chosen(cfg)
    return any("values_NT" in spec_of(fn).inputs for fn in chosen)


def tis_level(cfg: Config) -> str:
    """The truncated importance sampling level ('' = off); auto: per token when samples may be stale
    (asynchronous or partial rollouts)."""
    if cfg.algo.tis == "auto":
        return "token" if cfg.rollout.max_staleness > 0 or cfg.rollout.partial else ""
    return "" if cfg.algo.tis == "off" else cfg.algo.tis


def _section(name: str, *, but: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Every key of section `name` except `but`."""
    section = next(f for f in dataclasses.fields(Config) if f.name == name).default_factory  # type: ignore[misc]
    return tuple(f"{name}.{f.name}" for f in dataclasses.fields(section) if f.name not in but)


ENVIRONMENT_TASKS = ("verifiers", "openenv")  # tasks whose environment brings its own reward (task.env)
EPISODE_LIMITS = ("agent.max_turns", "agent.max_episode_tokens", "agent.max_observation_tokens",
                  "agent.observation_template", "agent.workers")  # what AgentEngine reads, whatever plays


def plays_episodes(cfg: Config) -> bool:
    """Whether the rollouts are episodes that AgentEngine plays against an environment, turn by turn:
    agent.environment's, or an OpenEnv environment's (task.name=openenv)."""
    return bool(cfg.agent.environment) or cfg.task.name == "openenv"


def opens_conversations(cfg: Config) -> bool:
    """Whether reasonrl renders each problem's conversation through the chat template itself, so that a
    system message of its own (model.system_prompt, model.reasoning_format) can open it."""
    return (cfg.model.chat_template and cfg.task.name not in ENVIRONMENT_TASKS and not cfg.task.agent
            and not cfg.agent.environment)


# What the reward.* knobs build, which a reward of one's own replaces (reward.on_error applies to any reward).
_BUILT_REWARD = _section("reward", but=("fn", "on_error"))


def replaced_by_own_reward(cfg: Config) -> list[str]:
    """The reward knobs set away from their default, which a reward of one's own (reward.fn, or
    train(cfg, reward=...)) leaves without effect."""
    defaults = Config()
    return [key for key in _BUILT_REWARD if cfg.value(key) != defaults.value(key)]


_VERIFIER_KNOBS = ("reward.verifier", "reward.extract", "reward.math_workers", "reward.math_timeout_s")
_BUILT_BESIDE_EPISODES = ("fn", "on_error", "custom", "custom_weight", *(k.removeprefix("reward.") for k in _VERIFIER_KNOBS))


def environment_takes_verifier(cfg: Config) -> bool:
    """Whether agent.environment is a built-in environment that checks answers with reward.verifier's verifier
    (`build_agent_engine` gives one to those that declare it as an input; an import path gets none)."""
    name = cfg.agent.environment
    return name in ENVIRONMENTS and "verifier" in spec_of(ENVIRONMENTS[name]).inputs


def _checks_math(cfg: Config, verifiers: tuple[str, ...]) -> bool:
    """Whether reward.verifier is one of `verifiers` and builds reasonrl's math checks (a reasoning-gym
    environment's own checker replaces the math verifier)."""
    return cfg.reward.verifier in verifiers and not (cfg.task.name == "environment" and cfg.reward.verifier == "math")


def _runs_local_judge(cfg: Config) -> bool:
    return bool(cfg.reward.judge_model) and not cfg.reward.judge_url


def _sizes_training_split(cfg: Config) -> bool:
    """Whether task.train_size sizes the task's training split: not jsonl's (all of task.train_path), humaneval's
    (the problems not held out) or a benchmark's without one."""
    name = cfg.task.name
    return name not in ("jsonl", "humaneval") and (name not in BENCHMARKS or BENCHMARKS[name].has_train)


GATES = (
    # First, so that its reason is the one given: reward.fn is the whole reward.
    Gate(_BUILT_REWARD, "reward.fn is not set (reward.fn is the whole reward; reward.custom adds "
         "to the configured components instead)", lambda c: not c.reward.fn),
    Gate(("algo.kl_estimator", "algo.kl_in"), "algo.kl_coef > 0", lambda c: c.algo.kl_coef > 0),
    Gate(("algo.kl_horizon",), "algo.kl_target > 0 (the adaptive KL coefficient)", lambda c: c.algo.kl_target > 0),
    Gate(("algo.tis_cap",), "truncated importance sampling is on (algo.tis=token or sequence, or auto with "
         "rollout.max_staleness > 0 or rollout.partial)", lambda c: bool(tis_level(c))),
    Gate(("algo.mis_low", "algo.mis_high"), "algo.mis is not off", lambda c: c.algo.mis != "off"),
    Gate(_section("critic"), "the advantage estimator reads a critic (algo.advantage=gae)", _uses_critic),
    Gate(_section("guidance", but=("mode",)), "guidance.mode is not off", lambda c: c.guidance.mode != "off"),
    Gate(("guidance.weight", "guidance.schedule", "guidance.decay_steps"), "guidance.mode=mixed",
         lambda c: c.guidance.mode == "mixed"),
    Gate(("guidance.every",), "guidance.mode=interleave", lambda c: c.guidance.mode == "interleave"),
    Gate(("guidance.gamma",), "guidance.weighting=shaped", lambda c: c.guidance.weighting == "shaped"),
    Gate(("guidance.solution_field",), "guidance.source=expert", lambda c: c.guidance.source == "expert"),
    Gate(_section("prime", but=("enabled",)), "prime.enabled=true", lambda c: c.prime.enabled),
    Gate(_section("distill", but=("teacher",)), "distill.teacher is set (reasonrl distill --teacher MODEL)",
         lambda c: bool(c.distill.teacher)),
    Gate(EPISODE_LIMITS, "agent.environment is set or task.name=openenv (episodes are played)", plays_episodes),
    Gate(_section("agent", but=("environment", *(key.removeprefix("agent.") for key in EPISODE_LIMITS))),
         "agent.environment is set",
         lambda c: bool(c.agent.environment)),
    Gate(("sampling.band_low", "sampling.band_high"), "sampling.problems=band", lambda c: c.sampling.problems == "band"),
    Gate(("sampling.difficulty_field",), "sampling.problems=competence or pass_rate",
         lambda c: c.sampling.problems in ("competence", "pass_rate")),
    Gate(("sampling.initial_competence",), "sampling.problems=competence",
         lambda c: c.sampling.problems == "competence"),
    Gate(("sampling.advance_at",), "sampling.problems=pass_rate", lambda c: c.sampling.problems == "pass_rate"),
    Gate(("sampling.pass_rate_decay",), "sampling.problems=band or pass_rate, or sampling.adaptive_budget",
         lambda c: c.sampling.problems in ("band", "pass_rate") or c.sampling.adaptive_budget),
    Gate(("sampling.dynamic_keep", "sampling.max_rounds"), "sampling.dynamic=true", lambda c: c.sampling.dynamic),
    Gate(("sampling.min_samples",), "sampling.adaptive_budget=true", lambda c: c.sampling.adaptive_budget),
    Gate(("rollout.tree_segment_tokens",), "rollout.tree is set", lambda c: bool(c.rollout.tree)),
    Gate(("rollout.max_batch_rows",), "rollout.fused=true (the fused decoder's continuous batch bounds its rows)",
         lambda c: c.rollout.fused),
    Gate(("rollout.max_partial_versions",), "rollout.partial=true", lambda c: c.rollout.partial),
    Gate(("reward.format_style", "reward.format_gated"), "reward.format_weight > 0",
         lambda c: c.reward.format_weight > 0),
    Gate(("reward.custom_weight",), "reward.custom is set", lambda c: bool(c.reward.custom)),
    Gate(("reward.overlong_weight",), "reward.overlong_buffer > 0", lambda c: c.reward.overlong_buffer > 0),
    Gate(("reward.repetition_weight",), "reward.repetition_ngram > 0", lambda c: c.reward.repetition_ngram > 0),
    Gate(("reward.confidence_weight",), "reward.confidence is set", lambda c: bool(c.reward.confidence)),
    Gate(("reward.judge_url", "reward.judge_votes", "reward.judge_parse", "reward.judge_weight"),
         "reward.judge_model is set", lambda c: bool(c.reward.judge_model)),
    Gate(("reward.reward_model_weight",), "reward.reward_model is set", lambda c: bool(c.reward.reward_model)),
    Gate(("reward.process_weight", "reward.process_aggregate", "reward.process_split", "reward.process_gated"),
         "reward.process_model is set", lambda c: bool(c.reward.process_model)),
    Gate(("train.lora_alpha",), "train.lora_rank > 0", lambda c: c.train.lora_rank > 0),
    Gate(("task.data_dir", "task.hub"), f"task.name is a benchmark ({', '.join(BENCHMARKS)})",
         lambda c: c.task.name in BENCHMARKS),
    Gate(("task.data_dir",), "task.hub=false (task.hub=true reads the hub's copy)", lambda c: not c.task.hub),
    Gate(("task.train_size",), "task.name has a training split of that size (not jsonl, which trains on all of "
         "task.train_path, humaneval, which trains on the problems it does not hold out, or a benchmark without a "
         "training split)", _sizes_training_split),
    Gate(("rollout.fused", "rollout.cuda_graphs"), "the model decodes here: rollout.engine is not openai (reasonrl "
         "eval of a vllm run decodes with transformers), or reward.judge_model runs here (no reward.judge_url)",
         lambda c: c.rollout.engine != "openai" or _runs_local_judge(c)),
    Gate(("task.environment", "task.environment_config", "task.environment_levels"), "task.name=environment",
         lambda c: c.task.name == "environment"),
    Gate(("task.train_path", "task.test_path", "task.prompt_field", "task.answer_field", "task.difficulty_field"),
         "task.name=jsonl", lambda c: c.task.name == "jsonl"),
    Gate(("task.digits", "task.operands"), "task.name=arithmetic", lambda c: c.task.name == "arithmetic"),
    Gate(("task.agent_timeout_s",), "task.agent is set or task.name=verifiers (episodes an agent plays)",
         lambda c: bool(c.task.agent) or c.task.name == "verifiers"),
    Gate(("task.on_error",), "task.agent is set or task.name=verifiers or openenv (episodes that can fail)",
         lambda c: bool(c.task.agent) or c.task.name in ENVIRONMENT_TASKS),
    Gate(("task.env", "task.env_args"), "task.name=verifiers or openenv", lambda c: c.task.name in ENVIRONMENT_TASKS),
    Gate(("task.env_url", "task.action_field", "task.observation_field", "task.env_timeout_s"), "task.name=openenv",
         lambda c: c.task.name == "openenv"),
    Gate(("task.prompt_template",), "task.name is not verifiers or openenv (their environment writes the prompts)",
         lambda c: c.task.name not in ENVIRONMENT_TASKS),
    Gate(("model.system_prompt", "model.reasoning_format"), "model.chat_template=true and reasonrl opens the "
         "conversations (not with task.name=verifiers or openenv, task.agent or agent.environment, whose environment "
         "or agent writes them)", opens_conversations),
    Gate(_section("reward", but=("on_error",)), "task.name is not verifiers or openenv (the environment's own "
         "rewards are the reward)", lambda c: c.task.name not in ENVIRONMENT_TASKS),
    Gate(_section("reward"), "task.agent is not set (the float the agent returns is the whole reward)",
         lambda c: not c.task.agent),
    Gate(_section("reward", but=_BUILT_BESIDE_EPISODES), "agent.environment is not set (an episode's reward is "
         "what its environment scores; reward.custom adds to it)", lambda c: not c.agent.environment),
    Gate(_VERIFIER_KNOBS, "agent.environment is not set, or is a built-in environment that checks answers with a "
         "verifier (python_math)", lambda c: not c.agent.environment or environment_takes_verifier(c)),
    Gate(("reward.math_workers",), "reward.verifier is math or routed, and no agent.environment checks one answer at "
         "a time (not with task.name=environment either, whose environment checks its own answers)",
         lambda c: _checks_math(c, ("math", "routed")) and not c.agent.environment),
    Gate(("reward.math_timeout_s",), "reward.verifier is math, routed or majority_vote (not with "
         "task.name=environment, whose environment checks its own answers)",
         lambda c: _checks_math(c, ("math", "routed", "majority_vote"))),
    Gate((*_section("alarm"), "run.stop_on"), "run.alarms=true", lambda c: c.run.alarms),
    Gate(("run.sync_max_gap", "run.sync_probe_prompts", "run.sync_probe_tokens"), "run.sync_check=true",
         lambda c: c.run.sync_check),
    Gate(("run.hang_floor_s",), "run.hang_factor > 0 (the hang watchdog is on)", lambda c: c.run.hang_factor > 0),
    Gate(("run.ray_address", "run.ray_workers", "run.ray_cpus_per_worker", "run.ray_gpus_per_worker",
          "run.ray_threads_per_worker", "run.learner_workers"), "run.backend=ray", lambda c: c.run.backend == "ray"),
    Gate(("run.learner_shard", "run.ray_cpus_per_learner", "run.ray_gpus_per_learner"), "run.learner_workers > 0",
         lambda c: c.run.learner_workers > 0),
    Gate(("run.wandb_project", "run.wandb_name", "run.wandb_tags", "run.wandb_mode", "run.wandb_rollouts"),
         "run.wandb=true", lambda c: c.run.wandb),
)


def inapplicable(cfg: Config) -> dict[str, str]:
    """Every knob that `cfg` does not use, with why, in words."""
    reasons: dict[str, str] = {}
    for family in FAMILIES:
        chosen = family.chosen(cfg)
        used = frozenset().union(*(spec_of(fn).keys for fn in chosen))
        choice = cfg.value(family.choice) or "''"
        for key, owners in family.owned().items():
            if key not in used:
                reasons[key] = (f"{key} is used by {family.choice}={'/'.join(owners)}, and {family.choice} is "
                                f"{choice}")
    for gate in GATES:
        if not gate.applies(cfg):
            for key in gate.keys:
                reasons.setdefault(key, f"{key} applies only when {gate.when}")
    return reasons


def unused_knobs(cfg: Config) -> dict[str, str]:
    """The knobs set away from their default that `cfg` does not use, with why."""
    defaults = Config()
    return {key: why for key, why in inapplicable(cfg).items() if cfg.value(key) != defaults.value(key)}


def check_knobs_used(cfg: Config) -> None:
    """A ConfigError naming every knob set away from its default that nothing `cfg` chooses uses."""
    if unused := unused_knobs(cfg):
        listed = "; ".join(f"{key}={cfg.value(key)!r} has no effect: {why}" for key, why in unused.items())
        them = "it" if len(unused) == 1 else "them"
        raise ConfigError(f"{listed}. Remove {them}, or choose what uses {them}")
