"""Run configuration: typed, frozen dataclasses are the single source of defaults and docs.

A TOML file sets only what differs from the defaults; `section.key=value` arguments override
it. Every value is checked once, when the config is built: an unknown key or a bad value is an
error naming the key and what is allowed. Each knob is documented where it is defined (the
`doc` of `knob`), and `reasonrl train --help` prints those docs.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from reasonrl.algo.advantages import ADVANTAGES
from reasonrl.algo.aggregation import AGGREGATIONS
from reasonrl.algo.kl import KL_ESTIMATORS
from reasonrl.algo.objectives import OBJECTIVES
from reasonrl.registry import is_import_path
from reasonrl.rewards import EXTRACTORS, VERIFIERS
from reasonrl.sampling import SAMPLERS
from reasonrl.sampling.stages import parse_stages

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


class ConfigError(ValueError):
    """A config key or value that cannot be used; the message names the key and the fix."""


def knob(default: Any, doc: str, *, choices: Sequence[str] | Mapping[str, Any] | None = None,
         low: float | None = None, high: float | None = None, extensible: bool = False) -> Any:
    """A config field with its one-line doc and the values it accepts.

    `choices` lists the allowed strings (a registry's keys); `extensible` also accepts a
    'package.module:function' import path; `low`/`high` bound numbers (inclusive).
    """
    metadata = {"doc": doc, "choices": tuple(choices) if choices is not None else None,
                "low": low, "high": high, "extensible": extensible}
    if isinstance(default, (list, tuple)):
        return field(default_factory=lambda: tuple(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class ModelConfig:
    name: str = knob(DEFAULT_MODEL, "policy to train: a hub id or a local HF model directory")
    chat_template: bool = knob(True, "wrap prompts in the tokenizer's chat template when it has one")


@dataclass(frozen=True)
class TaskConfig:
    name: str = knob("arithmetic", "built-in task (arithmetic; humaneval, an evaluation set scored by reward.verifier="
                     "code), or 'jsonl' for your own files", choices=("arithmetic", "humaneval", "jsonl"))
    train_path: str = knob("", "jsonl task: training problems, one JSON object per line")
    test_path: str = knob("", "jsonl task: held-out problems (default: carve test_size off train_path)")
    prompt_field: str = knob("question", "jsonl task: field holding the prompt")
    answer_field: str = knob("answer", "jsonl task: field holding the gold answer")
    prompt_template: str = knob(
        "{prompt}\nPut the final answer in \\boxed{{}}.",
        "how a problem becomes the user message; {prompt} is the problem text (humaneval: its own code-block "
        "template unless this is set)")
    train_size: int = knob(5000, "arithmetic task: number of training problems", low=1)
    test_size: int = knob(200, "held-out problems (arithmetic: generated; jsonl: carved off if no test_path; "
                          "humaneval: the last ones, the rest go to train)", low=0)
    digits: int = knob(2, "arithmetic task: digits per operand", low=1, high=12)
    operands: int = knob(2, "arithmetic task: numbers per sum", low=2, high=10)


@dataclass(frozen=True)
class RewardConfig:
    verifier: str = knob("math", "what scores an answer: math = math-verify against the gold answer (component "
                         "'correct'); majority_vote = label-free, agreement with the group's most common answer "
                         "(TTRL; component 'majority', with 'correct' logged at weight 0); code = pass rate of the problem's "
                         "unit tests in the sandbox (metadata tests / test_code / io_tests); routed = each problem's "
                         "metadata['verifier'] names one of these; or 'package.module:function'",
                         choices=(*VERIFIERS, "routed"), extensible=True)
    correct_weight: float = knob(1.0, "weight of the verifier's component")
    extract: str = knob("auto", "how the answer is found in the completion", choices=EXTRACTORS)
    math_workers: int = knob(0, "math verifier: 0 = check in this process (bounded by answer-size limits); N > 0 = "
                             "check each group in N worker processes with a hard per-check timeout", low=0)
    math_timeout_s: float = knob(5.0, "math verifier with math_workers > 0: seconds per check; a check past it "
                                 "scores 0 and its worker is replaced", low=0.1)
    format_weight: float = knob(0.1, "weight of the format reward (answer written in format_style)")
    format_style: str = knob("boxed", "format the format reward asks for", choices=("boxed", "answer_tag", "think_answer"))
    format_gated: bool = knob(True, "the format reward only counts for correct answers, so that group normalisation "
                              "cannot turn the small bonus into a reason to format wrong answers")
    custom: str = knob("", "extra reward 'package.module:function' taking (completion, problem) -> float, "
                       "or an object with score_group(problem, completions) (docs/rewards.md)")
    custom_weight: float = knob(1.0, "weight of the custom reward")
    overlong_buffer: int = knob(0, "DAPO soft overlong punishment: over the last this many tokens before "
                                "rollout.max_new_tokens the penalty falls from 0 to -1 (component 'overlong'; 0: off)",
                                low=0)
    overlong_weight: float = knob(1.0, "weight of the overlong punishment")
    cosine_length: bool = knob(False, "replace the verifier's term by Yeo et al.'s cosine length-scaled reward "
                               "(correct: 2 -> 1 and wrong: -10 -> 0 as the length goes from 0 to "
                               "rollout.max_new_tokens, truncated: -10; component 'cosine' at correct_weight, the "
                               "verifier logged at weight 0)")
    repetition_ngram: int = knob(0, "n-gram repetition penalty (Yeo et al.): n in tokens; the penalty is minus the "
                                 "share of repeated n-grams (component 'repetition'; 0: off)", low=0)
    repetition_weight: float = knob(1.0, "weight of the repetition penalty")
    confidence: str = knob("", "label-free confidence reward (component 'confidence'): self_certainty (KL from "
                           "uniform of the policy's next-token distributions, INTUITOR), neg_entropy (minus their "
                           "entropy), sequence_logprob (mean sampled log-prob, no extra forward); '': off",
                           choices=("", "self_certainty", "neg_entropy", "sequence_logprob"))
    confidence_weight: float = knob(1.0, "weight of the confidence reward")
    judge_model: str = knob("", "LLM-as-a-judge reward (component 'judge'): the judge model, a hub id or directory "
                            "run locally, or the served model's name with judge_url; '': off")
    judge_url: str = knob("", "judge: an OpenAI-compatible server's API root (e.g. http://127.0.0.1:8000/v1); '': run "
                          "judge_model locally")
    judge_votes: int = knob(1, "judge: samples per completion, averaged (scores) or majority-voted (verdicts)", low=1)
    judge_parse: str = knob("score", "judge: the rubric asks for a 0-10 score or a CORRECT/INCORRECT verdict",
                            choices=("score", "verdict"))
    judge_weight: float = knob(1.0, "weight of the judge reward")
    reward_model: str = knob("", "discriminative reward model (component 'reward_model'): a sequence-classification "
                             "model, hub id or directory, scored with a sigmoid of its logit; '': off")
    reward_model_weight: float = knob(1.0, "weight of the reward model")
    on_error: str = knob("stop", "a reward that raises: stop = stop the run showing the sample; skip_group = leave "
                         "that group out of the step (and of evaluation), count it in reward/error_groups and "
                         "write it with the error to RUN_DIR/reward_errors.jsonl", choices=("stop", "skip_group"))


@dataclass(frozen=True)
class RolloutConfig:
    engine: str = knob("hf", "rollout engine", choices=("hf",))
    prompts_per_step: int = knob(4, "problems sampled per training step", low=1)
    group_size: int = knob(8, "completions sampled per problem (G)", low=1)
    max_new_tokens: int = knob(64, "completion length limit in tokens", low=1)
    temperature: float = knob(0.7, "sampling temperature (also the learner's logit temperature)", low=0.0)
    top_p: float = knob(1.0, "nucleus sampling mass", low=0.0, high=1.0)
    top_k: int = knob(0, "sample among the k most likely tokens (0: all)", low=0)
    stop: tuple[str, ...] = knob((), "strings that end a completion (besides the end-of-sequence token)")
    dtype: str = knob("auto", "engine weights: auto = bfloat16 where the hardware has it, else float32",
                      choices=("auto", "float32", "bfloat16", "float16"))
    fused: bool = knob(True, "decode Llama-family models (Llama, Mistral, Qwen2/3) with the fused decoder; "
                       "false, or another architecture: the transformers forward")


@dataclass(frozen=True)
class SamplingConfig:
    problems: str = knob("shuffle", "which problems each step trains on: shuffle = every problem once per epoch in "
                         "a fresh order; band = online difficulty filtering, skip problems whose running pass rate "
                         "is outside [band_low, band_high]; competence = easiest first, the open share growing as "
                         "sqrt(t / T) (Platanios et al. 2019); pass_rate = one difficulty level at a time, the next "
                         "once the running accuracy reaches advance_at", choices=SAMPLERS)
    band_low: float = knob(0.2, "band: lowest running pass rate kept (PRIME's band is [0.2, 0.8])", low=0.0, high=1.0)
    band_high: float = knob(0.8, "band: highest running pass rate kept", low=0.0, high=1.0)
    pass_rate_decay: float = knob(0.5, "weight of the past in running pass rates (band, pass_rate)", low=0.0,
                                  high=0.99)
    difficulty_field: str = knob("difficulty", "competence, pass_rate: the problem metadata field giving its "
                                 "difficulty (a number; lower is easier)")
    initial_competence: float = knob(0.1, "competence: share of the easiest problems open at step 0", low=0.01,
                                     high=1.0)
    advance_at: float = knob(0.8, "pass_rate: running accuracy at which the next difficulty level opens", low=0.01,
                             high=1.0)
    dynamic: bool = knob(False, "DAPO dynamic sampling: drop groups whose rewards are all equal and generate more "
                         "problems until the batch is full (sampling/dropped_groups)")
    max_rounds: int = knob(3, "dynamic: generation rounds per step at most; then the step trains on what it has "
                           "(sampling/short_groups)", low=1)
    adaptive_budget: bool = knob(False, "more completions for problems the policy fails, fewer for solved ones: "
                                 "rollout.prompts_per_step * rollout.group_size in total, shared by running failure "
                                 "rate (at least min_samples each)")
    min_samples: int = knob(2, "adaptive_budget: completions per problem at least", low=1)
    replay: int = knob(0, "experience replay: keep this many correct completions per problem and put one into a "
                       "group whose completions are all wrong (train with algo.tis=token for the off-policy "
                       "correction); 0: off", low=0)
    stages: tuple[str, ...] = knob((), "multi-stage schedule, each 'STEP: key=value ...' with keys max_new_tokens, "
                                   "group_size, sources (metadata source names joined by +), e.g. "
                                   "['0: max_new_tokens=64', '100: max_new_tokens=128 sources=gsm8k+math500']; "
                                   "unset keys keep the config's values")
    mask_truncated: bool = knob(False, "overlong filtering (DAPO): completions cut at rollout.max_new_tokens get "
                                "no loss (they still count in their group's advantage baseline)")


@dataclass(frozen=True)
class AlgoConfig:
    advantage: str = knob("grpo", "advantage estimator (docs/algorithms.md)", choices=ADVANTAGES, extensible=True)
    objective: str = knob("ppo_clip", "per-token policy objective", choices=OBJECTIVES, extensible=True)
    aggregation: str = knob("token_mean", "how per-token losses become one scalar", choices=AGGREGATIONS, extensible=True)
    clip_low: float = knob(0.2, "ppo_clip/gspo/cispo/gmpo/clip_cov: lower clip range (ratio >= 1 - clip_low; "
                           "gmpo: log-ratio >= -clip_low); applies to every objective: the papers' own "
                           "ranges (gspo 3e-4/4e-4, gmpo 0.4, cispo 1/4) are set by their recipes", low=0.0)
    clip_high: float = knob(0.2, "upper clip range (ratio <= 1 + clip_high; DAPO uses 0.28; "
                            "gmpo: log-ratio <= clip_high)", low=0.0)
    dual_clip: float = knob(0.0, "ppo_clip: cap the loss of a negative-advantage token at -dual_clip * A "
                            "(dual-clip PPO, e.g. 3; 0: off)", low=0.0)
    adv_eps: float = knob(1e-6, "grpo/grpo_batch_std: added to the std before dividing", low=0.0)
    gamma: float = knob(1.0, "reinforce_pp/gae: discount per token", low=0.0, high=1.0)
    lam: float = knob(0.95, "gae: lambda", low=0.0, high=1.0)
    kl_coef: float = knob(0.0, "weight of the KL penalty to the frozen initial policy (0: no reference model)", low=0.0)
    kl_estimator: str = knob("k3", "per-token KL estimator", choices=KL_ESTIMATORS)
    kl_in: str = knob("loss", "where the KL penalty goes: 'loss' (a term of the loss) or 'reward' "
                      "(subtracted from the reward per token, before the advantages)", choices=("loss", "reward"))
    kl_target: float = knob(0.0, "adapt kl_coef towards this KL per token (Ziegler et al. 2019; 0: fixed)", low=0.0)
    kl_horizon: int = knob(10_000, "adaptive KL: horizon in sequences", low=1)
    ref_reset_every: int = knob(0, "copy the policy into the reference model every this many steps (0: never)", low=0)
    entropy_coef: float = knob(0.0, "weight of an entropy bonus (added to any objective)", low=0.0)
    tis: str = knob("off", "truncated importance sampling between the learner's and the rollout engine's "
                    "log-probs: off, token or sequence", choices=("off", "token", "sequence"))
    tis_cap: float = knob(2.0, "truncated importance sampling: weight cap", low=1.0)
    clip_cov_ratio: float = knob(2e-4, "clip_cov: share of tokens whose gradient is detached", low=0.0, high=1.0)
    cov_low: float = knob(1.0, "clip_cov: lower bound of the covariance band")
    cov_high: float = knob(5.0, "clip_cov: upper bound of the covariance band")
    kl_cov_ratio: float = knob(2e-3, "kl_cov: share of tokens (highest covariance) given the KL penalty",
                               low=0.0, high=1.0)
    kl_cov_coef: float = knob(1.0, "kl_cov: weight of |logp - old_logp| on those tokens", low=0.0)


@dataclass(frozen=True)
class CriticConfig:
    model: str = knob("", "value model for advantage=gae (hub id or local directory; empty: model.name)")
    lr: float = knob(1e-5, "critic AdamW learning rate", low=0.0)
    value_clip: float = knob(0.2, "clipped value loss: how far one update may move a value", low=0.0)
    weight_decay: float = knob(0.0, "critic AdamW weight decay", low=0.0)


@dataclass(frozen=True)
class TrainConfig:
    steps: int = knob(40, "training steps (one rollout batch each)", low=0)
    lr: float = knob(2e-5, "AdamW learning rate", low=0.0)
    warmup_steps: int = knob(0, "linear learning-rate warm-up, in optimizer steps", low=0)
    weight_decay: float = knob(0.0, "AdamW weight decay", low=0.0)
    beta1: float = knob(0.9, "AdamW beta1", low=0.0, high=1.0)
    beta2: float = knob(0.999, "AdamW beta2", low=0.0, high=1.0)
    grad_clip: float = knob(1.0, "clip the gradient's global norm to this (0: off)", low=0.0)
    ppo_epochs: int = knob(1, "passes over each rollout batch", low=1)
    mini_batches: int = knob(1, "optimizer steps per pass (the rollout batch is split into this many)", low=1)
    micro_batch_size: int = knob(8, "sequences per forward/backward (gradient accumulation)", low=1)
    lora_rank: int = knob(0, "0: train every weight; > 0: train LoRA adapters of this rank on every linear layer "
                          "(peft) and sync only the adapters to the rollout engine", low=0)
    lora_alpha: float = knob(32.0, "LoRA scaling numerator (the update is scaled by lora_alpha / lora_rank)", low=0.0)
    gradient_checkpointing: bool = knob(False, "recompute activations in the backward pass instead of keeping them "
                                        "(less memory, about a third more compute)")
    dtype: str = knob("auto", "compute dtype of the update (weights and optimizer stay float32): "
                      "auto = bfloat16 autocast where the hardware has it", choices=("auto", "float32", "bfloat16"))


@dataclass(frozen=True)
class SFTConfig:
    batch_size: int = knob(16, "reasonrl sft: examples per optimizer step (train.steps steps; task.answer_field names "
                           "the solution)", low=1)
    max_tokens: int = knob(1024, "reasonrl sft: solutions are cut at this many tokens", low=1)


@dataclass(frozen=True)
class RFTConfig:
    problems_per_round: int = knob(32, "reasonrl rft: training problems sampled per round (rollout.group_size "
                                   "completions each; train.steps counts rounds)", low=1)
    steps_per_round: int = knob(4, "reasonrl rft: SFT steps of sft.batch_size kept samples per round", low=1)


@dataclass(frozen=True)
class DPOConfig:
    beta: float = knob(0.1, "reasonrl dpo: strength of the implicit KL to the reference (DPO's beta)", low=0.0)
    pairs_per_step: int = knob(8, "reasonrl dpo: preference pairs per optimizer step (online: problems sampled)",
                               low=1)
    online: bool = knob(False, "reasonrl dpo: build pairs from the best and worst of rollout.group_size fresh "
                        "samples per problem, scored by the reward (else: offline pairs from the task)")
    rejected_field: str = knob("rejected", "reasonrl dpo, offline: the data field holding the rejected response "
                               "(task.answer_field holds the chosen one)")


@dataclass(frozen=True)
class EvalConfig:
    every: int = knob(0, "evaluate every this many steps (0: only before and after training)", low=0)
    problems: int = knob(100, "held-out problems per evaluation (at most task.test_size)", low=0)
    samples: int = knob(4, "sampled completions per problem, at rollout.temperature (0: greedy only)", low=0)
    greedy: bool = knob(True, "also evaluate greedy decoding")
    before: bool = knob(True, "evaluate before the first step, to report the improvement")


@dataclass(frozen=True)
class RunConfig:
    dir: str = knob("runs/%Y%m%d-%H%M%S", "where the run writes config, metrics, rollouts and checkpoints "
                    "(strftime codes such as %Y%m%d-%H%M%S are filled in when the run starts)")
    seed: int = knob(0, "seed of every random choice (problems, sampling, init)")
    device: str = knob("auto", "auto = cuda when available, else cpu", choices=("auto", "cpu", "cuda"))
    keep_freed_memory: bool = knob(True, "on CPU, let the allocator keep freed memory for reuse: steps run "
                                   "faster (no page faults), peak memory is higher")
    resume: bool = knob(False, "continue from the newest checkpoint in run.dir")
    save_every: int = knob(10, "checkpoint every this many steps (and at the end; 0: only at the end)", low=0)
    keep_checkpoints: int = knob(2, "newest checkpoints kept on disk", low=1)
    tensorboard: bool = knob(True, "also log to TensorBoard when it is installed")
    progress: bool = knob(True, "show a live progress bar")
    log_every: int = knob(5, "print a line of metrics every this many steps (0: never)", low=0)


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
    rft: RFTConfig = field(default_factory=RFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {section.name: _section_dict(getattr(self, section.name)) for section in dataclasses.fields(self)}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(tomli_w.dumps(self.to_dict()))


def _section_dict(section: Any) -> dict[str, Any]:
    return {f.name: list(v) if isinstance(v := getattr(section, f.name), tuple) else v
            for f in dataclasses.fields(section)}


def _section_types() -> dict[str, type]:
    return {f.name: f.default_factory for f in dataclasses.fields(Config)}  # type: ignore[misc]


def _coerce(key: str, value: Any, annotation: Any) -> Any:
    """`value` as the type `annotation` asks for, or a ConfigError naming `key`."""
    if annotation is bool:
        if isinstance(value, bool):
            return value
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif annotation is str:
        if isinstance(value, str):
            return value
    elif typing.get_origin(annotation) is tuple:
        if isinstance(value, str):
            value = [value] if value else []
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
    else:
        raise TypeError(f"config field {key} has an unsupported type {annotation}")
    name = getattr(annotation, "__name__", str(annotation))
    raise ConfigError(f"{key}: expected {name}, got {value!r}")


def _check(key: str, value: Any, spec: dataclasses.Field) -> None:
    meta = spec.metadata
    choices = meta["choices"]
    if choices is not None and value not in choices and not (meta["extensible"] and is_import_path(value)):
        extra = ", or 'package.module:function'" if meta["extensible"] else ""
        raise ConfigError(f"{key}: {value!r} is not allowed; allowed: {', '.join(choices)}{extra}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: {value!r} is not a finite number")
    if meta["low"] is not None and value < meta["low"]:
        raise ConfigError(f"{key}: {value!r} is below its minimum {meta['low']}")
    if meta["high"] is not None and value > meta["high"]:
        raise ConfigError(f"{key}: {value!r} is above its maximum {meta['high']}")


def _parse_cli_value(text: str) -> Any:
    """A command-line value as TOML (numbers, booleans, arrays); anything else is a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def build_config(values: Mapping[str, Mapping[str, Any]]) -> Config:
    """A validated Config from nested {section: {key: value}}; missing keys keep defaults."""
    section_types = _section_types()
    sections = {}
    for section_name, section_values in values.items():
        if section_name not in section_types:
            raise ConfigError(f"unknown config section {section_name!r}; sections: {', '.join(section_types)}")
        if not isinstance(section_values, Mapping):
            raise ConfigError(f"{section_name}: expected a table of keys, got {section_values!r}")
    for section_name, section_cls in section_types.items():
        specs = {f.name: f for f in dataclasses.fields(section_cls)}
        hints = typing.get_type_hints(section_cls)
        kwargs = {}
        for key, value in values.get(section_name, {}).items():
            dotted = f"{section_name}.{key}"
            if key not in specs:
                raise ConfigError(f"unknown config key {dotted!r}; keys of [{section_name}]: {', '.join(specs)}")
            kwargs[key] = _coerce(dotted, value, hints[key])
            _check(dotted, kwargs[key], specs[key])
        sections[section_name] = section_cls(**kwargs)
    return _check_consistency(Config(**sections))


def _check_consistency(cfg: Config) -> Config:
    if cfg.task.name == "jsonl" and not cfg.task.train_path:
        raise ConfigError("task.name='jsonl' needs task.train_path=FILE.jsonl")
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
    if any(stage.max_new_tokens for stage in stages) and (cfg.reward.overlong_buffer or cfg.reward.cosine_length):
        raise ConfigError("sampling.stages changes the length limit, but reward.overlong_buffer / "
                          "reward.cosine_length measure length against rollout.max_new_tokens: use one or the other")
    if cfg.algo.ref_reset_every and not cfg.algo.kl_coef:
        raise ConfigError("algo.ref_reset_every resets the reference model of the KL penalty: set algo.kl_coef > 0")
    if cfg.algo.kl_target and not cfg.algo.kl_coef:
        raise ConfigError("algo.kl_target adapts algo.kl_coef, which is 0: give it a starting value > 0")
    if cfg.rollout.group_size * cfg.rollout.prompts_per_step < cfg.train.mini_batches:
        raise ConfigError("train.mini_batches is larger than the rollout batch "
                          "(rollout.prompts_per_step * rollout.group_size sequences)")
    return cfg


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Defaults, then the TOML file at `path`, then `section.key=value` overrides."""
    values: dict[str, dict[str, Any]] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        try:
            values = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    for override in overrides:
        dotted, sep, text = override.partition("=")
        section, dot, key = dotted.strip().partition(".")
        if not sep or not dot or not key:
            raise ConfigError(f"bad override {override!r}: expected section.key=value, e.g. train.lr=1e-5")
        if not isinstance(values.setdefault(section, {}), dict):
            raise ConfigError(f"{section}: expected a table of keys in the config file, got {values[section]!r}")
        values[section][key] = _parse_cli_value(text.strip())
    return build_config(values)


def describe_knobs() -> str:
    """Every knob with its type, default and doc, grouped by section, for --help."""
    lines = []
    for section_name, section_cls in _section_types().items():
        lines.append(f"[{section_name}]")
        hints = typing.get_type_hints(section_cls)
        defaults = section_cls()
        for spec in dataclasses.fields(section_cls):
            default = getattr(defaults, spec.name)
            type_name = getattr(hints[spec.name], "__name__", "list")
            choices = spec.metadata["choices"]
            allowed = f" {{{'|'.join(choices)}}}" if choices else ""
            lines.append(f"  {section_name}.{spec.name} ({type_name}, default {default!r}){allowed}\n"
                         f"      {spec.metadata['doc']}")
    return "\n".join(lines)

