"""The problem samplers sampling.problems can name: each entry builds its sampler over the task's
training problems from the knobs it declares (reasonrl.spec). A new sampler is a function here
and a line in `SAMPLERS`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from reasonrl.sampling.difficulty import BandSampler, CompetenceCurriculum, PassRateCurriculum
from reasonrl.sampling.epochs import EpochSampler
from reasonrl.spec import declare
from reasonrl.types import Problem, Sampler


@declare(context={"seed": "run.seed"})
def shuffle(problems: Sequence[Problem], *, seed: int) -> Sampler:
    """Every problem once per epoch, in a new order each epoch."""
    return EpochSampler(len(problems), seed=seed)


@declare(knobs={"low": "sampling.band_low", "high": "sampling.band_high", "decay": "sampling.pass_rate_decay"},
         context={"seed": "run.seed"})
def band(problems: Sequence[Problem], *, low: float, high: float, decay: float, seed: int) -> Sampler:
    """The problems whose running pass rate lies in [low, high]."""
    return BandSampler(len(problems), low=low, high=high, seed=seed, decay=decay)


@declare(knobs={"field_name": "sampling.difficulty_field", "initial": "sampling.initial_competence"},
         context={"seed": "run.seed", "total_steps": "train.steps"})
def competence(problems: Sequence[Problem], *, field_name: str, initial: float, total_steps: int,
               seed: int) -> Sampler:
    """The problems up to a difficulty that rises with the steps."""
    return CompetenceCurriculum(difficulties(problems, field_name), total_steps=total_steps, initial=initial,
                                seed=seed)


@declare(knobs={"field_name": "sampling.difficulty_field", "advance_at": "sampling.advance_at",
                "decay": "sampling.pass_rate_decay"}, context={"seed": "run.seed"})
def pass_rate(problems: Sequence[Problem], *, field_name: str, advance_at: float, decay: float, seed: int) -> Sampler:
    """The problems of one difficulty level, the next once the running accuracy reaches `advance_at`."""
    return PassRateCurriculum(difficulties(problems, field_name), advance_at=advance_at, decay=decay, seed=seed)


def difficulties(problems: Sequence[Problem], field_name: str) -> list[float]:
    """Each problem's metadata[field_name], a number, which a curriculum orders the problems by."""
    found = []
    for problem in problems:
        value = problem.metadata.get(field_name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(  # noqa: TRY004 (a bad value in the task's data, not a wrong argument)
                f"a curriculum orders problems by metadata[{field_name!r}] (sampling.difficulty_field), "
                f"but problem {problem.id!r} has {value!r}; give every training problem a number there")
        found.append(float(value))
    return found


SAMPLERS: dict[str, Callable[..., Sampler]] = {"shuffle": shuffle, "band": band, "competence": competence,
                                               "pass_rate": pass_rate}
