"""The reward cfg.reward asks for, from a registry of components: each `Component` declares when
it is on, its weight and how it is built, and `COMPONENTS` lists them in the order they are
summed (an order that is part of the reward's value, in floating point). A new component is an
entry there; its knobs are fields of RewardConfig.

Also here: the verifier (reward.verifier, or 'routed' per problem), the LLM judge, the confidence
rewards that run the policy, an agent environment's episode reward, and the rewards of the tasks
whose environment scores its own episodes (TASK_REWARDS: verifiers, OpenEnv).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reasonrl.agents import EpisodeReward, EpisodeStatistic, TurnRewards
from reasonrl.agents.openai_agents import AgentReward
from reasonrl.algo.advantages import ADVANTAGES, is_token_level
from reasonrl.models import load_model, load_tokenizer, pick_device, resolve_dtype, resolve_model_path
from reasonrl.registry import is_import_path, lookup
from reasonrl.rewards import (
    VERIFIERS,
    CosineLengthReward,
    FormatReward,
    MathReward,
    PooledMathReward,
    RepetitionPenalty,
    RoutedReward,
    SelfCertaintyReward,
    SequenceLogProbReward,
    SoftOverlongPunishment,
    WeightedReward,
    build_reward,
)
from reasonrl.rewards.code import default_verifier
from reasonrl.rewards.compose import is_group_reward
from reasonrl.rewards.judge import ClassifierReward, InvalidVotes, JudgeReward
from reasonrl.rewards.prm import load_process_model
from reasonrl.rewards.process import ProcessReward
from reasonrl.rollout import HFEngine
from reasonrl.rollout.openai import OpenAIEngine
from reasonrl.spec import arguments
from reasonrl.tasks import EnvironmentReward, environment_from_spec
from reasonrl.tasks.verifiers_env import plays_itself, verifiers_components
from reasonrl.types import CORRECT, GroupReward, Problem, RewardFn

if TYPE_CHECKING:  # the config is read, not imported: it sits above the rewards
    from reasonrl.config import Config

Reward = RewardFn | GroupReward


@dataclass(frozen=True)
class RewardInputs:
    """What components are built from besides the config: the verifier (built once, shared by the
    components that check answers), and for the rewards that run the policy, the policy, the
    engine's prompt ids and the tokenizer (a process reward finds each step's last token with it)."""

    verifier: Reward
    policy: Any = None
    prompt_ids_fn: Callable[[Problem], list[int]] | None = None
    tokenizer: Any = None


@dataclass(frozen=True)
class Component:
    """A reward component: `name` (logged as reward/<name>), `on(cfg)` whether the config asks for
    it, `weight` (the config key of its weight, or a rule of the config), `build(cfg, inputs)`."""

    name: str
    on: Callable[[Config], bool]
    weight: str | Callable[[Config], float]
    build: Callable[[Config, RewardInputs], Reward]

    def weight_in(self, cfg: Config) -> float:
        return cfg.value(self.weight) if isinstance(self.weight, str) else self.weight(cfg)


def _gates_format(cfg: Config) -> bool:
    return bool(cfg.reward.format_weight) and cfg.reward.format_gated


def _scores_answers(cfg: Config) -> bool:
    """Whether the verifier's component is in the reward: a gate is scored (and logged) even at weight 0."""
    r = cfg.reward
    return bool(r.correct_weight or _gates_format(cfg) or r.cosine_length)


def _verifier_weight(cfg: Config) -> float:
    """The verifier's weight; 0 when the cosine length reward carries it."""
    return 0.0 if cfg.reward.cosine_length else cfg.reward.correct_weight


def _logged(cfg: Config) -> float:
    """Weight 0: a component logged beside the reward, not part of it."""
    return 0.0


def _label_free(cfg: Config) -> bool:
    return cfg.reward.verifier == "majority_vote"


def _cosine(cfg: Config, inputs: RewardInputs) -> Reward:
    if is_group_reward(inputs.verifier):
        raise ValueError(f"reward.cosine_length needs a verifier that checks one answer at a time; "
                         f"reward.verifier={cfg.reward.verifier!r} scores whole groups")
    return CosineLengthReward(max_length=cfg.rollout.max_new_tokens, correct=inputs.verifier)


def _confidence(cfg: Config, inputs: RewardInputs) -> GroupReward:
    if cfg.reward.confidence == "sequence_logprob":
        return SequenceLogProbReward()
    if inputs.policy is None or inputs.prompt_ids_fn is None:
        raise ValueError(f"reward.confidence={cfg.reward.confidence!r} runs the policy: build the reward with the "
                         "policy and the engine's prompt ids")
    return SelfCertaintyReward(model=inputs.policy, prompt_ids_fn=inputs.prompt_ids_fn,
                               measure=cfg.reward.confidence, temperature=cfg.rollout.temperature)


def _process(cfg: Config, inputs: RewardInputs) -> Reward:
    r = cfg.reward
    return ProcessReward(load_process_model(resolve_model_path(r.process_model)), split=r.process_split,
                         aggregate=r.process_aggregate, gated_by=inputs.verifier if r.process_gated else None,
                         tokenizer=inputs.tokenizer)


COMPONENTS = (
    Component("cosine", lambda c: c.reward.cosine_length, "reward.correct_weight", _cosine),
    Component(CORRECT, lambda c: not _label_free(c) and _scores_answers(c), _verifier_weight,
              lambda c, inputs: inputs.verifier),
    Component("majority", lambda c: _label_free(c) and _scores_answers(c), _verifier_weight,
              lambda c, inputs: inputs.verifier),
    # Label-free training: accuracy against the gold answer is still worth watching.
    Component(CORRECT, _label_free, _logged,
              lambda c, inputs: MathReward(extract=c.reward.extract, timeout_s=c.reward.math_timeout_s)),
    Component("format", lambda c: bool(c.reward.format_weight), "reward.format_weight",
              lambda c, inputs: FormatReward(style=c.reward.format_style)),
    Component("custom", lambda c: bool(c.reward.custom), "reward.custom_weight",
              lambda c, inputs: build_reward(c.reward.custom)),
    Component("overlong", lambda c: bool(c.reward.overlong_buffer), "reward.overlong_weight",
              lambda c, inputs: SoftOverlongPunishment(max_length=c.rollout.max_new_tokens,
                                                       cache_length=c.reward.overlong_buffer)),
    Component("repetition", lambda c: bool(c.reward.repetition_ngram), "reward.repetition_weight",
              lambda c, inputs: RepetitionPenalty(ngram_size=c.reward.repetition_ngram)),
    Component("confidence", lambda c: bool(c.reward.confidence), "reward.confidence_weight", _confidence),
    Component("judge", lambda c: bool(c.reward.judge_model), "reward.judge_weight", lambda c, inputs: build_judge(c)),
    Component("process", lambda c: bool(c.reward.process_model), "reward.process_weight", _process),
    Component("reward_model", lambda c: bool(c.reward.reward_model), "reward.reward_model_weight",
              lambda c, inputs: ClassifierReward.from_pretrained(resolve_model_path(c.reward.reward_model))),
)


def configured_reward(cfg: Config, inputs: RewardInputs) -> WeightedReward:
    """The components of COMPONENTS that cfg.reward turns on, in that order, with their weights."""
    components = {c.name: (c.build(cfg, inputs), c.weight_in(cfg)) for c in COMPONENTS if c.on(cfg)}
    if "judge" in components:  # right after the judge, whose last group it reads
        items = list(components.items())
        at = list(components).index("judge") + 1
        components = dict([*items[:at], ("judge/invalid", (InvalidVotes(components["judge"][0]), 0.0)), *items[at:]])
    if not any(weight for _, weight in components.values()):
        raise ValueError("every reward weight is 0: set reward.correct_weight, reward.format_weight or reward.custom")
    primary = "majority" if _label_free(cfg) else CORRECT
    return WeightedReward(components, gates={"format": primary} if _gates_format(cfg) else None)


def episode_reward(cfg: Config) -> WeightedReward:
    """The environment scored each episode as it was played: its total is the reward. The verifier's
    verdict and the tool-use statistics are logged beside it (weight 0) as reward/correct and
    reward/tool/<statistic>; a reward.custom component still adds to the total."""
    # A token-level estimator (e.g. reasonrl.agents.credit:turn_grpo) gets each turn's reward on that turn.
    token_level = is_token_level(lookup(ADVANTAGES, cfg.algo.advantage, "advantage estimator"))
    components: dict[str, tuple[Reward, float]] = {
        "episode": (TurnRewards() if token_level else EpisodeReward(), 1.0), CORRECT: (EpisodeStatistic("correct"), 0.0),
        **{f"tool/{name}": (EpisodeStatistic(name), 0.0) for name in ("valid", "invalid", "turns")}}
    if cfg.reward.custom:
        components["custom"] = (build_reward(cfg.reward.custom), cfg.reward.custom_weight)
    return WeightedReward(components)


def openenv_reward(cfg: Config) -> WeightedReward:
    """An OpenEnv episode's reward: the sum of its steps' rewards (each on its turn for a token-level
    estimator), with the number of turns logged beside it (reward/turns, weight 0)."""
    token_level = is_token_level(lookup(ADVANTAGES, cfg.algo.advantage, "advantage estimator"))
    return WeightedReward({"episode": (TurnRewards() if token_level else EpisodeReward(), 1.0),
                           "turns": (EpisodeStatistic("turns"), 0.0)})


def verifiers_reward(cfg: Config) -> WeightedReward:
    """A verifiers environment's own scoring: each reward, judge and metric of its tasks a component
    when its episodes are single replies; the reward of each episode it plays itself otherwise."""
    t = cfg.task
    if not plays_itself(t.env, t.env_args):
        return WeightedReward(verifiers_components(env=t.env, env_args=t.env_args, count=t.train_size + t.test_size))
    refusals = {"run.backend=local (the endpoint serves the engine in this process)": cfg.run.backend != "local",
                "rollout.engine=hf or vllm (the calls continue token ids)": cfg.rollout.engine == "openai",
                "rollout.tree='' (the calls are not sampled as trees)": bool(cfg.rollout.tree),
                "sampling.replay=0 (a stored completion continues another episode's prompt)": cfg.sampling.replay > 0}
    if wrong := [fix for fix, refused in refusals.items() if refused]:
        raise ValueError(f"task.env={t.env!r} plays its own episodes (its harness, tools or agents), which cannot be "
                         f"combined with the current settings: set {'; '.join(wrong)}")
    return WeightedReward({"episode": (AgentReward(), 1.0)})


TASK_REWARDS: dict[str, Callable[[Config], WeightedReward]] = {"openenv": openenv_reward,
                                                               "verifiers": verifiers_reward}
"""The reward of a task whose environment scores its own episodes, by task.name (cfg.reward does not apply)."""


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


def build_verifier(cfg: Config) -> Reward:
    """The reward that scores an answer (cfg.reward.verifier); 'routed' lets each problem name its own."""
    r = cfg.reward

    def verifier(name: str) -> Reward:
        if name == "math" and r.math_workers:
            return PooledMathReward(extract=r.extract, workers=r.math_workers, timeout_s=r.math_timeout_s)
        if name == "math":
            return MathReward(extract=r.extract, timeout_s=r.math_timeout_s)
        factory = lookup(VERIFIERS, name, "verifier")
        return factory if is_import_path(name) else factory(**arguments(factory, cfg.value))

    if cfg.task.name == "environment" and r.verifier == "math":  # each environment checks its own answers
        return EnvironmentReward(environment_from_spec(cfg.task.environment, cfg.task.environment_config))
    if r.verifier == "routed":
        return RoutedReward({name: verifier(name) for name in VERIFIERS}, key="verifier", default=default_verifier)
    return verifier(r.verifier)
