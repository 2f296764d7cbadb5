"""Multi-stage schedules: a run in stages that change the length limit, the group size or the data
sources at given steps, as in DeepScaleR's 8k -> 16k -> 24k context stages (Luo et al. 2025) or
domain stages that train on one source of a mixture before the next.

A stage is written "STEP: key=value key=value", e.g. "0: max_new_tokens=64 sources=easy",
"100: max_new_tokens=128 sources=easy+hard". Keys: `max_new_tokens`, `group_size`, `sources`
(`metadata["source"]` names joined by "+"). A stage keeps the values it does not set from the
config (not from the stage before), and lasts until the next stage's step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from reasonrl.types import Problem

STAGE_KEYS = ("max_new_tokens", "group_size", "sources")


@dataclass(frozen=True)
class Stage:
    start_step: int
    max_new_tokens: int | None = None
    group_size: int | None = None
    sources: frozenset[str] | None = None


def parse_stage(spec: str) -> Stage:
    """One "STEP: key=value ..." stage; a ValueError names what is wrong."""
    step_text, colon, settings = spec.partition(":")
    if not colon or not step_text.strip().isdigit():
        raise ValueError(f"stage {spec!r}: expected 'STEP: key=value ...', e.g. '100: max_new_tokens=128'")
    values: dict[str, object] = {}
    for setting in settings.split():
        key, equals, value = setting.partition("=")
        if not equals or key not in STAGE_KEYS or not value:
            raise ValueError(f"stage {spec!r}: {setting!r} is not key=value with a key among {', '.join(STAGE_KEYS)}")
        if key == "sources":
            values[key] = frozenset(value.split("+"))
        elif not value.isdigit() or int(value) < 1:
            raise ValueError(f"stage {spec!r}: {key} must be a positive integer, got {value!r}")
        else:
            values[key] = int(value)
    return Stage(start_step=int(step_text), **values)  # type: ignore[arg-type]


def parse_stages(specs: Sequence[str]) -> list[Stage]:
    """The stages in step order; steps must be distinct."""
    stages = sorted((parse_stage(spec) for spec in specs), key=lambda stage: stage.start_step)
    steps = [stage.start_step for stage in stages]
    if len(set(steps)) != len(steps):
        raise ValueError(f"two stages start at the same step: {steps}")
    return stages


def stage_at(stages: Sequence[Stage], step: int) -> Stage | None:
    """The stage in force at `step` (0-based: the step about to run), or None before the first."""
    current = None
    for stage in stages:
        if stage.start_step <= step:
            current = stage
    return current


def from_sources(draw: Callable[[int], list[int]], problems: Sequence[Problem], sources: frozenset[str] | None,
                 count: int) -> list[int]:
    """`count` indices from `draw` whose problems come from `sources` (all when None): indices of
    other sources are passed over, for at most one pass's worth of draws per index wanted."""
    if sources is None:
        return draw(count)
    chosen: list[int] = []
    for _ in range(count * max(len(problems), 1)):
        index = draw(1)[0]
        if str(problems[index].metadata.get("source")) in sources:
            chosen.append(index)
            if len(chosen) == count:
                return chosen
    present = sorted({str(p.metadata.get("source")) for p in problems})
    raise ValueError(f"a stage draws from sources {sorted(sources)}, but the sampler found too few of their "
                     f"problems (sources of the task: {', '.join(present)})")
