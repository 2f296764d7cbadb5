"""Staged pipelines: SFT -> RL, RFT rounds, staged RL runs, ... as one resumable command.

A pipeline file is TOML:

    dir = "runs/sft-then-grpo"          # every stage runs in dir/<stage name>
    config = "grpo"                     # optional: the base config (a recipe name or a TOML file)
    overrides = ["train.lr=1e-5"]       # optional: applied to every stage

    [[stage]]
    name = "cold-start"
    kind = "sft"                        # sft | rl | dpo | rft
    overrides = ["task.name=jsonl", "task.train_path=solutions.jsonl", "task.answer_field=solution",
                 "train.steps=50"]

    [[stage]]
    name = "grpo"
    kind = "rl"
    config = "dapo"                     # optional: this stage's own base config
    overrides = ["train.steps=200"]

Each stage starts from the previous stage's final policy (the first from the config's
`model.name`). Running the same command again resumes: finished stages (their final checkpoint
exists) are skipped, an interrupted one continues from its newest checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from reasonrl.config import Config, ConfigError, load_config, read_toml
from reasonrl.recipes import config_path
from reasonrl.training.checkpoint import checkpoints
from reasonrl.training.skeleton import RunInterrupted

STAGE_KINDS = ("sft", "rl", "dpo", "rft")


@dataclass(frozen=True)
class PipelineStage:
    name: str
    kind: str
    config: Config


def load_pipeline(path: str | Path) -> list[PipelineStage]:
    """The stages of a pipeline file, each with its full config (run.dir and model.name chained)."""
    path = Path(path)
    spec = read_toml(path, "pipeline")
    stages_spec = spec.get("stage")
    if not isinstance(stages_spec, list) or not stages_spec:
        raise ConfigError(f"{path}: no [[stage]] tables; a pipeline needs at least one stage")
    root = Path(spec.get("dir", f"runs/{path.stem}"))
    common = list(spec.get("overrides", []))
    stages: list[PipelineStage] = []
    model: str | None = None
    for index, stage in enumerate(stages_spec):
        name, kind = stage.get("name", f"stage{index}"), stage.get("kind")
        if kind not in STAGE_KINDS:
            raise ConfigError(f"{path}: stage {name!r} has kind {kind!r}; allowed: {', '.join(STAGE_KINDS)}")
        if any(s.name == name for s in stages):
            raise ConfigError(f"{path}: two stages are named {name!r}")
        base = stage.get("config", spec.get("config"))
        chained = [f"run.dir={root / name}"] + ([f"model.name={model}"] if model else [])
        cfg = load_config(config_path(base) if base else None, [*common, *stage.get("overrides", []), *chained])
        stages.append(PipelineStage(name=name, kind=kind, config=cfg))
        model = str(root / name / "checkpoints" / f"step_{cfg.train.steps:06d}" / "policy")
    return stages


def stage_done(stage: PipelineStage) -> bool:
    return (Path(stage.config.run.dir) / "checkpoints" / f"step_{stage.config.train.steps:06d}").is_dir()


def run_pipeline(path: str | Path, *, runners: dict[str, Callable[[Config], object]] | None = None,
                 log: Callable[[str], None] = print) -> list[PipelineStage]:
    """Run every unfinished stage in order (resuming an interrupted one); the stages."""
    from dataclasses import replace

    stages = load_pipeline(path)
    runners = runners or _runners()
    for stage in stages:
        if stage_done(stage):
            log(f"stage {stage.name} ({stage.kind}): done, skipped")
            continue
        cfg = stage.config
        if checkpoints(cfg.run.dir):
            cfg = replace(cfg, run=replace(cfg.run, resume="latest"))
            log(f"stage {stage.name} ({stage.kind}): resuming in {cfg.run.dir}")
        else:
            log(f"stage {stage.name} ({stage.kind}): starting in {cfg.run.dir} from {cfg.model.name}")
        try:
            runners[stage.kind](cfg)
        except RunInterrupted as stopped:  # the pipeline, run again, resumes the stage and goes on after it
            raise RunInterrupted(f"stage {stage.name} ({stage.kind}) {stopped.where}", f"reasonrl pipeline {path}") from None
    return stages


def _runners() -> dict[str, Callable[[Config], object]]:
    from reasonrl.stages.preference import train_dpo
    from reasonrl.stages.rft import train_rft
    from reasonrl.stages.sft import train_sft
    from reasonrl.trainer import train

    return {"sft": train_sft, "rl": train, "dpo": train_dpo, "rft": train_rft}
