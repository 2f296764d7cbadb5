"""Run configuration: typed, frozen dataclasses are the single source of defaults and docs.

A TOML file sets only what differs from the defaults; `section.key=value` arguments override
it. Every value is checked once, when the config is built: an unknown key or a bad value is an
error naming the key and what is allowed. Each knob is documented where it is defined (the
`doc` of `knob`), and `reasonrl train --help` prints those docs.

- `knobs`: what the schema is made of (`knob`, ConfigError); `rollout_sections` (model, task, reward,
  rollout, agent, sampling, guidance), `update_sections` (algo, the methods' sections, train, sft,
  rft, dpo) and `sections` (eval, alarm, run, and `Config`, which holds them all): the schema, a
  dataclass per section whose fields are knobs;
- `loading`: a Config from a file and overrides, each value coerced and checked (`load_config`,
  `build_config`), and `describe_knobs` for --help;
- `consistency`: the sections checked against each other once built.

They import the registries whose names the knobs accept (algorithms, rewards, samplers, tasks,
alarms), never the loop or its builders.
"""

from reasonrl.config.consistency import tree_branching
from reasonrl.config.knobs import DEFAULT_MODEL, ConfigError, knob
from reasonrl.config.loading import build_config, describe_knobs, load_config, read_toml
from reasonrl.config.rollout_sections import (
    AgentConfig,
    GuidanceConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    SamplingConfig,
    TaskConfig,
)
from reasonrl.config.sections import AlarmConfig, Config, EvalConfig, RunConfig
from reasonrl.config.update_sections import (
    AlgoConfig,
    CriticConfig,
    DistillConfig,
    DPOConfig,
    PrimeConfig,
    RFTConfig,
    SFTConfig,
    TrainConfig,
)

__all__ = [
    "DEFAULT_MODEL",
    "AgentConfig",
    "AlarmConfig",
    "AlgoConfig",
    "Config",
    "ConfigError",
    "CriticConfig",
    "DPOConfig",
    "DistillConfig",
    "EvalConfig",
    "GuidanceConfig",
    "ModelConfig",
    "PrimeConfig",
    "RFTConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "SFTConfig",
    "SamplingConfig",
    "TaskConfig",
    "TrainConfig",
    "build_config",
    "describe_knobs",
    "knob",
    "load_config",
    "read_toml",
    "tree_branching",
]
