"""Every refusal of settings that cannot be combined, with the fix, rather than a run done wrong:
`check_consistency` across sections, run once a config is built; `refuse_unsupported`, what
training cannot do although the config is valid (e.g. a served engine is fine for evaluation),
run before a training run or stage loads anything."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from reasonrl.config.applicability import ENVIRONMENT_TASKS, FAMILIES, check_knobs_used
from reasonrl.config.knobs import ALARMS, ConfigError
from reasonrl.config.sections import Config
from reasonrl.registry import import_object, is_import_path, json_arguments, lookup
from reasonrl.rewards import REWARDS
from reasonrl.sampling.stages import parse_stages
from reasonrl.spec import spec_of


def check_consistency(cfg: Config) -> Config:
    """`cfg` itself when its sections agree; else a ConfigError naming the keys and the fix."""
    if cfg.task.name == "jsonl" and not cfg.task.train_path:
        raise ConfigError("task.name='jsonl' needs task.train_path=FILE.jsonl")
    if cfg.task.name == "environment" and not cfg.task.environment:
        raise ConfigError("task.name='environment' needs task.environment=NAME (a reasoning-gym dataset, "
                          "package.module:factory, or NAME=WEIGHT,NAME=WEIGHT)")
    if cfg.task.name == "humaneval" and cfg.reward.verifier not in ("code", "routed"):
        raise ConfigError(f"task.name='humaneval' is scored by running unit tests: set reward.verifier=code "
                          f"(it is {cfg.reward.verifier!r})")
    if cfg.sampling.band_low > cfg.sampling.band_high:
        raise ConfigError(f"sampling.band_low={cfg.sampling.band_low} is above sampling.band_high="
                          f"{cfg.sampling.band_high}")
    if cfg.sampling.adaptive_budget and cfg.rollout.group_size < cfg.sampling.min_samples:
        raise ConfigError(f"sampling.adaptive_budget shares rollout.group_size={cfg.rollout.group_size} completions "
                          f"per problem on average, fewer than sampling.min_samples={cfg.sampling.min_samples}")
    try:
        stages = parse_stages(cfg.sampling.stages)
    except ValueError as exc:
        raise ConfigError(f"sampling.stages: {exc}") from None
    _check_label_free(cfg)
    if cfg.agent.environment and cfg.sampling.replay:
        raise ConfigError("sampling.replay stores completions without their episode records (which the episode "
                          "reward reads): it cannot be used with agent.environment yet; set sampling.replay=0")
    if cfg.algo.advantage.endswith(":turn_grpo") and (cfg.sampling.adaptive_budget
                                                      or any(stage.group_size for stage in stages)):
        raise ConfigError("turn_grpo normalises over groups of rollout.group_size episodes: turn off "
                          "sampling.adaptive_budget and stages that change group_size")
    # The length rewards measure each group against the budget it was sampled under (a stage's too).
    budgets = {"rollout.max_new_tokens": cfg.rollout.max_new_tokens,
               **{f"the stage at step {stage.start_step}": stage.max_new_tokens for stage in stages
                  if stage.max_new_tokens}}
    if short := {where: budget for where, budget in budgets.items() if cfg.reward.overlong_buffer > budget}:
        where, budget = next(iter(short.items()))
        raise ConfigError(f"reward.overlong_buffer={cfg.reward.overlong_buffer} is longer than the generation budget "
                          f"of {where} ({budget}): the punishment starts that many tokens before the limit; set it at "
                          "most the smallest budget (DAPO's: a fifth of it)")
    if cfg.algo.kl_coef and cfg.algo.kl_in == "loss" and cfg.algo.kl_estimator == "k1":
        raise ConfigError("algo.kl_estimator=k1 in the loss has zero expected gradient (its gradient is grad log pi, "
                          "whose mean under the policy's own samples is 0): it adds noise, not a penalty. Use k3 or k2 "
                          "in the loss, or put k1 in the reward with algo.kl_in=reward")
    if cfg.algo.ref_reset_every and not cfg.algo.kl_coef:
        raise ConfigError("algo.ref_reset_every resets the reference model of the KL penalty: set algo.kl_coef > 0")
    if cfg.algo.kl_target and not cfg.algo.kl_coef:
        raise ConfigError("algo.kl_target adapts algo.kl_coef, which is 0: give it a starting value > 0")
    if cfg.distill.teacher and cfg.run.backend == "ray":
        raise ConfigError("distill.teacher runs with run.backend=local (distillation with Ray rollout workers is not "
                          "supported yet)")
    _check_own_rewards(cfg)
    _check_prime(cfg)
    _check_tree(cfg, stages)
    _check_engine(cfg)
    _check_agent(cfg)
    _check_environment_task(cfg)
    unknown_alarms = [name for name in cfg.run.stop_on if name not in ALARMS]
    if unknown_alarms:
        raise ConfigError(f"run.stop_on: unknown alarms {', '.join(map(repr, unknown_alarms))}; alarms: "
                          f"{', '.join(ALARMS)}")
    if cfg.rollout.group_size * cfg.rollout.prompts_per_step < cfg.train.mini_batches:
        raise ConfigError("train.mini_batches is larger than the rollout batch "
                          "(rollout.prompts_per_step * rollout.group_size sequences)")
    _check_group_sizes(cfg, stages)
    check_knobs_used(cfg)
    return cfg


def refuse_unsupported(cfg: Config) -> None:
    """Combinations of knobs that training cannot run, refused before anything is loaded."""
    if cfg.rollout.engine == "openai":
        raise ValueError("rollout.engine=openai samples a served model that training cannot update (its weights do "
                         "not follow the learner), and the API returns neither the sampled token ids nor their "
                         "log-probs: train with rollout.engine=hf or vllm; evaluate the served model with `reasonrl "
                         "eval --config CONFIG MODEL`")
    if cfg.run.learner_shard and cfg.train.lora_rank:
        raise ValueError("run.learner_shard trains every weight: it does not combine with train.lora_rank (the "
                         "adapters are small; the replicated data-parallel learner trains them)")
    if cfg.run.learner_shard and cfg.train.optimizer_state != "float32":
        raise ValueError(f"run.learner_shard shards AdamW's float32 state over the ranks; train.optimizer_state="
                         f"{cfg.train.optimizer_state} (bitsandbytes) does not take sharded weights: use one or the other")
    if cfg.run.backend == "ray" and cfg.agent.environment:
        raise ValueError("agent environments run with run.backend=local (the Ray workers hold plain engines)")
    if cfg.rollout.max_staleness:
        if cfg.algo.advantage == "remax":
            raise ValueError("algo.advantage=remax generates its greedy baseline with the rollout engine while the "
                             "learner trains: use rollout.max_staleness=0")
        if cfg.reward.confidence in ("self_certainty", "neg_entropy"):
            raise ValueError(f"reward.confidence={cfg.reward.confidence} runs the policy being trained on each "
                             "sample: use rollout.max_staleness=0, or confidence=sequence_logprob")
    if cfg.rollout.partial:
        _refuse_with_partial_rollouts(cfg)
    if cfg.distill.reward_weight == 0 and not cfg.distill.teacher:
        raise ValueError("distill.reward_weight=0 trains on the teacher's signal alone, but distill.teacher is not "
                         "set: name a teacher (e.g. `reasonrl distill --teacher MODEL`)")


def _refuse_with_partial_rollouts(cfg: Config) -> None:
    """rollout.partial pauses completions inside the in-process engine's continuous batch; what samples
    elsewhere, or samples other than independent completions, cannot be paused there."""
    others = {"rollout.engine=" + cfg.rollout.engine: cfg.rollout.engine != "hf",
              "rollout.fused=false": not cfg.rollout.fused, "run.backend=ray": cfg.run.backend == "ray",
              "rollout.tree": bool(cfg.rollout.tree), "sampling.adaptive_budget": cfg.sampling.adaptive_budget,
              "agent.environment": bool(cfg.agent.environment), "task.agent": bool(cfg.task.agent),
              f"task.name={cfg.task.name}": cfg.task.name in ENVIRONMENT_TASKS}
    if clashes := [name for name, clash in others.items() if clash]:
        raise ValueError(f"rollout.partial pauses independent completions in the in-process engine "
                         f"(rollout.engine=hf, rollout.fused=true); it does not combine with {', '.join(clashes)}")


def _check_own_rewards(cfg: Config) -> None:
    """Import the user's reward code now, so that a typo or a missing module is a config error
    before any model loads, not a traceback minutes later."""
    for key in ("reward.fn", "reward.custom", "reward.verifier"):
        spec = cfg.value(key)
        if not spec or (key == "reward.verifier" and not is_import_path(spec)):  # a built-in verifier: a choice
            continue
        try:
            reward = lookup(REWARDS, spec, "reward")
        except ValueError as exc:
            raise ConfigError(f"{key}: {exc}") from None
        if not callable(reward) and not callable(getattr(reward, "score_group", None)):
            raise ConfigError(f"{key}={spec!r} is a {type(reward).__name__}: expected a function "
                              "(completion, problem) -> float or an object with score_group(problem, completions)")


def _check_label_free(cfg: Config) -> None:
    """A label-free reward (reward.verifier=majority_vote) still logs the gold check as the "correct"
    component, at weight 0, to watch; what selects or labels by solutions (`Group.solved` reads that
    component) would hand the gold answers to training."""
    if cfg.reward.verifier != "majority_vote":
        return
    reading = [name for name, on in (
        ("sampling.dynamic with dynamic_keep=correctness (use dynamic_keep=reward)",
         cfg.sampling.dynamic and cfg.sampling.dynamic_keep == "correctness"),
        ("sampling.replay", cfg.sampling.replay > 0),
        (f"sampling.problems={cfg.sampling.problems}", cfg.sampling.problems in ("band", "pass_rate")),
        ("sampling.adaptive_budget", cfg.sampling.adaptive_budget),
        (f"guidance.mode={cfg.guidance.mode}", cfg.guidance.mode != "off"),
        ("prime.enabled (its PRM learns from the outcome labels)", cfg.prime.enabled)) if on]
    if reading:
        raise ConfigError("reward.verifier=majority_vote learns without gold answers, but "
                          f"{', '.join(reading)} would select or label by them (the \"correct\" component it logs "
                          "to watch): turn them off")


def _check_group_sizes(cfg: Config, stages: Sequence[Any]) -> None:
    """A group smaller than the advantage estimator can tell apart gives every sample an advantage of 0."""
    least = max((spec_of(fn).min_group_size for fn in FAMILIES[0].chosen(cfg)), default=1)
    sizes = {"rollout.group_size": cfg.rollout.group_size,
             **{f"sampling.stages ({stage.start_step}:)": stage.group_size for stage in stages if stage.group_size},
             **({"sampling.min_samples": cfg.sampling.min_samples} if cfg.sampling.adaptive_budget else {})}
    if small := {key: size for key, size in sizes.items() if size < least}:
        listed = ", ".join(f"{key}={size}" for key, size in small.items())
        raise ConfigError(f"{listed}: algo.advantage={cfg.algo.advantage} takes each sample's baseline from the other "
                          f"samples of its group, so groups need at least {least} samples (with fewer every advantage "
                          "is 0 and nothing is learned); raise it, or choose an estimator with another baseline "
                          "(remax, reinforce_pp, gae)")


def _check_agent(cfg: Config) -> None:
    """task.agent: a function that imports, and what its episodes cannot be combined with."""
    if not cfg.task.agent:
        return
    if not is_import_path(cfg.task.agent):
        raise ConfigError(f"task.agent={cfg.task.agent!r} must name your function as 'package.module:function' or "
                          "'path/to/file.py:function'")
    try:
        agent = import_object(cfg.task.agent)
    except ValueError as exc:
        raise ConfigError(f"task.agent: {exc}") from None
    if not callable(agent):
        raise ConfigError(f"task.agent={cfg.task.agent!r} is a {type(agent).__name__}: expected a function "
                          "(base_url, model, problem) -> float")
    refusals = {
        "agent.environment='' (the agent plays the episodes)": bool(cfg.agent.environment),
        "run.backend=local (the endpoint serves the engine in this process)": cfg.run.backend != "local",
        "rollout.engine=hf or vllm (the agent's calls continue token ids)": cfg.rollout.engine == "openai",
        "rollout.tree='' (the agent's calls are not sampled as trees)": bool(cfg.rollout.tree),
        "sampling.replay=0 (a stored completion continues a prompt the agent wrote for another episode)":
            cfg.sampling.replay > 0,
    }
    wrong = [fix for fix, refused in refusals.items() if refused]
    if wrong:
        raise ConfigError(f"task.agent cannot be combined with the current settings: set {'; '.join(wrong)}")


def _check_environment_task(cfg: Config) -> None:
    """task.name=verifiers or openenv: the environment it names, and what its episodes cannot be combined with."""
    t = cfg.task
    if t.name not in ENVIRONMENT_TASKS:
        return
    if t.name == "verifiers" and not t.env:
        raise ConfigError("task.name=verifiers needs task.env=ID (an installed verifiers environment) or "
                          "package.module:factory")
    if t.name == "openenv" and bool(t.env) == bool(t.env_url):
        raise ConfigError("task.name=openenv needs one of task.env_url=http://HOST:PORT (a running environment "
                          "server) or task.env=package.module:factory (returning a client)")
    if t.name == "openenv" and t.env and not is_import_path(t.env):
        raise ConfigError(f"task.env={t.env!r}: an OpenEnv client comes from 'package.module:factory' or "
                          "'path/to/file.py:factory' (or give the server's task.env_url)")
    try:
        json_arguments(t.env_args, "task.env_args")
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    refusals = {
        "agent.environment='' (the environment plays the episodes)": bool(cfg.agent.environment),
        "task.agent='' (the environment plays the episodes)": bool(cfg.task.agent),
    }
    if t.name == "openenv":
        refusals |= {
            "run.backend=local (the episodes are played in this process)": cfg.run.backend != "local",
            "rollout.engine=hf or vllm (episodes continue token ids)": cfg.rollout.engine == "openai",
            "rollout.tree='' (episodes are not sampled as trees)": bool(cfg.rollout.tree),
            "sampling.replay=0 (a stored completion has no episode record)": cfg.sampling.replay > 0,
        }
    wrong = [fix for fix, refused in refusals.items() if refused]
    if wrong:
        raise ConfigError(f"task.name={t.name} cannot be combined with the current settings: set {'; '.join(wrong)}")


def _check_engine(cfg: Config) -> None:
    """What rollout.engine=vllm or openai cannot be combined with, refused rather than done wrong."""
    r = cfg.rollout
    if r.engine == "openai" and not r.openai_url:
        raise ConfigError("rollout.engine=openai needs rollout.openai_url=http://HOST:PORT/v1, the server's API root")
    refusals = {
        "vllm": {
            "run.backend=local (the Ray rollout workers hold hf engines)": cfg.run.backend != "local",
            "run.device=auto or cuda (vLLM runs on a CUDA GPU)": cfg.run.device == "cpu",
            "train.lora_rank=0 (the engine takes whole weights, not LoRA adapters)": cfg.train.lora_rank > 0,
            "rollout.top_k=0 and rollout.top_p=1 (vLLM reports the log-probs of the truncated distribution, the "
            "learner recomputes untruncated ones)": r.top_k > 0 or r.top_p < 1.0,
        },
        "openai": {
            "agent.environment='' (episodes continue from token ids, which the API does not return)":
                bool(cfg.agent.environment),
        },
    }.get(r.engine, {})
    wrong = [fix for fix, refused in refusals.items() if refused]
    if wrong:
        raise ConfigError(f"rollout.engine={r.engine} cannot be combined with the current settings: set "
                          f"{'; '.join(wrong)}")


def _check_prime(cfg: Config) -> None:
    """What PRIME (prime.enabled) cannot be combined with, refused rather than done wrong."""
    if not cfg.prime.enabled:
        return
    refusals = {
        "algo.advantage=rloo": cfg.algo.advantage != "rloo",  # its advantages are RLOO over both reward sources
        "run.backend=local": cfg.run.backend != "local",
        "train.lora_rank=0 (the implicit PRM is a full copy of the model)": cfg.train.lora_rank > 0,
        "algo.kl_in=loss (PRIME's advantages replace a reward with the KL in it)": (cfg.algo.kl_in == "reward"
                                                                                   and cfg.algo.kl_coef > 0),
        "sampling.mask_truncated=false": cfg.sampling.mask_truncated,
        "distill.teacher unset": bool(cfg.distill.teacher),
    }
    wrong = [fix for fix, refused in refusals.items() if refused]
    if wrong:
        raise ConfigError(f"prime.enabled=true cannot be combined with the current settings: set {'; '.join(wrong)}")


def tree_branching(tree: str) -> tuple[int, ...]:
    """rollout.tree's branching factors ("2x2x2" -> (2, 2, 2)); () when off."""
    if not tree:
        return ()
    try:
        factors = tuple(int(part) for part in tree.lower().split("x"))
    except ValueError:
        factors = ()
    if not factors or min(factors) < 1 or math.prod(factors) < 2:
        raise ConfigError(f"rollout.tree={tree!r}: expected branching factors like 2x2x2 (positive integers, "
                          "at least 2 completions in all)")
    return factors


def _check_tree(cfg: Config, stages: Sequence[Any]) -> None:
    """rollout.tree's shape against the rest of the config; what it cannot be combined with is refused."""
    branching, r = tree_branching(cfg.rollout.tree), cfg.rollout
    if not branching:
        return
    if math.prod(branching) != r.group_size:
        raise ConfigError(f"rollout.tree={r.tree} samples {math.prod(branching)} completions per problem: set "
                          f"rollout.group_size={math.prod(branching)}")
    if r.tree_segment_tokens and r.max_new_tokens <= (len(branching) - 1) * r.tree_segment_tokens:
        raise ConfigError(f"rollout.tree={r.tree} branches after {len(branching) - 1} segments of "
                          f"{r.tree_segment_tokens} tokens, which leaves no room in rollout.max_new_tokens="
                          f"{r.max_new_tokens}: raise it or lower rollout.tree_segment_tokens")
    if not r.tree_segment_tokens and r.max_new_tokens < len(branching):
        raise ConfigError(f"rollout.tree={r.tree} needs a token per level: rollout.max_new_tokens >= {len(branching)}")
    refusals = {
        "sampling.adaptive_budget=false (a tree's size is its branching)": cfg.sampling.adaptive_budget,
        "sampling.stages without group_size": any(stage.group_size for stage in stages),
        "sampling.replay=0 (a replayed completion is not in the tree)": cfg.sampling.replay > 0,
        "agent.environment='' (episodes are not sampled as trees)": bool(cfg.agent.environment),
        "run.backend=local": cfg.run.backend != "local",
    }
    wrong = [fix for fix, refused in refusals.items() if refused]
    if wrong:
        raise ConfigError(f"rollout.tree cannot be combined with the current settings: set {'; '.join(wrong)}")


