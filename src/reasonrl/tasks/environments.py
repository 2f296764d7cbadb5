"""Environments: procedural problem generators that score their own answers, and Tasks built from them.

A `ProblemGenerator` (an environment of problems, not an agents.Environment, which plays episodes)
makes problem `index` of stream `seed` (always the same problem for the same pair)
and scores a completion against a problem it made. `environment_task` draws a Task from one:
the test problems from one seed, the training problems from another, skipping any whose prompt
is a test prompt, so the splits never share a question. `EnvironmentReward` is the matching
reward: it sends each problem to the environment named by its metadata["source"].

`ReasoningGymEnvironment` adapts any dataset of reasoning-gym (Stojanovski et al. 2025,
"Reasoning Gym: Reasoning Environments for Reinforcement Learning with Verifiable Rewards"),
scored by that dataset's own `score_answer`; `MixtureEnvironment` samples several environments by
weight. A user environment is any object with `name`, `generate` and `score`, e.g.:

    @dataclass(frozen=True)
    class AddTwo:
        name: str = "add_two"
        def generate(self, seed, index):
            rng = random.Random(f"{seed}-{index}")
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            return Problem(id=f"add-{seed}-{index}", prompt=f"{a} + {b} = ?", answer=str(a + b))
        def score(self, completion, problem):
            return float(completion.strip() == problem.answer)
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from reasonrl.rewards.answers import answer_tags, extract_answer_phrase, extract_answer_tag, extract_boxed
from reasonrl.rewards.bounded import Handler, call_bounded, count_stopped
from reasonrl.seeds import derive_seed31
from reasonrl.tasks.base import DatasetError, Task, prompt_text
from reasonrl.types import Problem

SCORE_TIMEOUT_S = 5.0
"""Seconds a reasoning-gym scorer may take on one answer, on any thread (see `ReasoningGymEnvironment`)."""
PREPARE_TIMEOUT_S = 120.0
"""Seconds a process may take to make a reasoning-gym dataset's scorer (not model text: a generous bound)."""
_SCORER = Handler("reasonrl.tasks.reasoning_gym_scoring", "score_answer")
_PREPARE = Handler("reasonrl.tasks.reasoning_gym_scoring", "prepare")

# reasoning-gym makes item i of a dataset seeded s from Random(s + i), and some datasets precompute per item at
# creation, so a stream is read in chunks: item `index` of stream `seed` is item index % CHUNK of a dataset of
# CHUNK items seeded seed + CHUNK * (index // CHUNK), i.e. Random(seed + index) as in one endless dataset.
_CHUNK = 500
_CACHED_CHUNKS = 8
_NONSENSE = "<answer>zq nonsense zq</answer>"


@runtime_checkable
class ProblemGenerator(Protocol):
    """A problem generator that scores its own problems."""

    name: str

    def generate(self, seed: int, index: int) -> Problem:
        """Problem `index` of the stream `seed`, with its reference answer and metadata; a pure function of both."""
        ...

    def score(self, completion: str, problem: Problem) -> float:
        """The reward of `completion` (the model's text) for a `problem` this environment generated."""
        ...


def environment_task(env: ProblemGenerator, *, train_size: int, test_size: int, seed: int = 0,
                     prompt_template: str = "{prompt}", max_attempts: int | None = None) -> Task:
    """`test_size` problems from seed derive_seed31(seed, "test"), then `train_size` from derive_seed31(seed,
    "train") whose prompts are not test prompts. Text prompts go through `prompt_template`; every
    problem has metadata["source"] (env.name unless the environment set it). Gives up after
    `max_attempts` draws per split (default 10 * size + 1000): the environment has too few distinct problems."""
    test = _draw(env, derive_seed31(seed, "test"), test_size, prompt_template, set(), max_attempts, "test")
    test_prompts = {prompt_text(problem) for problem in test}
    train = _draw(env, derive_seed31(seed, "train"), train_size, prompt_template, test_prompts, max_attempts, "train")
    return Task(name=env.name, train=train, test=test)


def _draw(env: ProblemGenerator, seed: int, size: int, template: str, excluded: set[str], max_attempts: int | None,
          split: str) -> list[Problem]:
    attempts = 10 * size + 1000 if max_attempts is None else max_attempts
    problems: list[Problem] = []
    for index in range(attempts):
        if len(problems) == size:
            break
        problem = env.generate(seed, index)
        if not isinstance(problem, Problem):
            raise TypeError(f"environment {env.name!r}: generate() returned {type(problem).__name__}, not a Problem")
        if isinstance(problem.prompt, str):
            problem = replace(problem, prompt=template.format(prompt=problem.prompt))
        if prompt_text(problem) in excluded:
            continue
        if "source" not in problem.metadata:
            problem = replace(problem, metadata={**problem.metadata, "source": env.name})
        problems.append(problem)
    if len(problems) < size:
        raise DatasetError(f"environment {env.name!r}: only {len(problems)} {split} problems in {attempts} draws "
                           f"(the others repeat test prompts); it has too few distinct problems for {size}: "
                           "lower the sizes or make the problems harder/larger")
    return problems


def extract_final_answer(completion: str) -> str | None:
    """The answer a completion gives: the content of its last <answer>...</answer> (None if empty), else its
    last \\boxed{...}, else its last "the answer is X" / "Final answer: X", else its last non-empty line
    (stripped); None for an empty completion."""
    if answer_tags(completion):
        return extract_answer_tag(completion)
    if (boxed := extract_boxed(completion)) is not None:
        return boxed
    if (stated := extract_answer_phrase(completion)) is not None:
        return stated
    lines = [line.strip() for line in completion.splitlines() if line.strip()]
    return lines[-1] if lines else None


class ReasoningGymEnvironment:
    """One reasoning-gym dataset, e.g. ReasoningGymEnvironment("basic_arithmetic", min_digits=2, max_digits=3).

    `config` goes to the dataset's config dataclass (its difficulty knobs: sizes, digits, terms, ...);
    an unknown key is an error listing the allowed ones. A problem's prompt is the dataset's question,
    its answer the dataset's reference answer ("" for datasets with many valid answers, which are
    scored by their own checker), and metadata["entry"] the whole dataset item, which `score` hands
    to the dataset's `score_answer` with the answer `extract_final_answer` finds in the completion,
    within `SCORE_TIMEOUT_S` seconds on any thread (past it the answer scores 0, counted in reward/timeouts).
    A dataset whose scorer gives full marks to a nonsense answer (game_of_life_halting in reasoning-gym
    0.1.25: any non-empty text) is refused, since it would reward anything.
    """

    def __init__(self, dataset_name: str, *, name: str | None = None, **config: Any) -> None:
        try:
            import reasoning_gym
            from reasoning_gym.factory import DATASETS

            from reasonrl.tasks import reasoning_gym_scoring
        except ImportError as exc:
            raise DatasetError("reasoning-gym environments need the 'reasoning-gym' package "
                               "(pip install reasoning-gym)") from exc
        if dataset_name not in DATASETS:
            close = difflib.get_close_matches(dataset_name, DATASETS, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(sorted(DATASETS))}"
            raise DatasetError(f"unknown reasoning-gym dataset {dataset_name!r}; {hint}")
        if dataset_name == "composite":  # its items name their sub-datasets, which this adapter scores one by one
            raise DatasetError("reasoning-gym's 'composite' dataset: mix datasets with MixtureEnvironment "
                               "(or a mixture of task.environment names) instead")
        allowed = {f.name for f in dataclasses.fields(DATASETS[dataset_name][1])} - {"seed", "size"}
        if unknown := sorted(set(config) - allowed):
            raise DatasetError(f"reasoning-gym dataset {dataset_name!r} has no setting {', '.join(unknown)}; "
                               f"its settings: {', '.join(sorted(allowed))}")
        self.dataset_name = dataset_name
        self.name = name or dataset_name
        self.config = dict(config)
        self._create = reasoning_gym.create_dataset
        self._datasets: dict[int, Any] = {}
        self._scorer = self._dataset(0)  # scoring does not depend on the seed; creating it validates the config
        reasoning_gym_scoring.prepare(dataset_name, self.config)  # this process's scorer, made outside the bound
        probe = self.generate(0, 0)
        if self.score(_NONSENSE, probe) >= 1.0:
            raise DatasetError(f"reasoning-gym dataset {dataset_name!r} gives full marks to a nonsense answer "
                               f"({_NONSENSE!r} for {probe.answer!r}): its score_answer would reward anything; "
                               "train on another dataset or a fixed reasoning-gym version")

    def __repr__(self) -> str:
        settings = "".join(f", {k}={v!r}" for k, v in self.config.items())
        return f"ReasoningGymEnvironment({self.dataset_name!r}{settings})"

    def _dataset(self, seed: int) -> Any:
        if seed not in self._datasets:
            if len(self._datasets) >= _CACHED_CHUNKS:  # training reads chunks in order: drop the oldest
                del self._datasets[next(iter(self._datasets))]
            try:
                self._datasets[seed] = self._create(self.dataset_name, seed=seed, size=_CHUNK, **self.config)
            except (AssertionError, ValueError, TypeError) as exc:  # reasoning-gym's config validation
                raise DatasetError(f"reasoning-gym dataset {self.dataset_name!r}: invalid settings "
                                   f"{self.config}: {exc}") from exc
        return self._datasets[seed]

    def generate(self, seed: int, index: int) -> Problem:
        chunk, offset = divmod(index, _CHUNK)
        entry = self._dataset((seed + _CHUNK * chunk) % 2**32)[offset]
        answer = entry["answer"]
        return Problem(id=f"{self.name}-{seed}-{index}", prompt=entry["question"],
                       answer="" if answer is None else str(answer),
                       metadata={"source": self.name, "seed": seed, "index": index, "entry": entry})

    def score(self, completion: str, problem: Problem) -> float:
        entry = problem.metadata.get("entry")
        source = entry.get("metadata", {}).get("source_dataset") if isinstance(entry, Mapping) else None
        if source != self.dataset_name:
            raise ValueError(f"problem {problem.id!r} was not made by reasoning-gym dataset {self.dataset_name!r} "
                             f"(metadata['entry'] is from {source!r}); route problems by metadata['source']")
        answer = extract_final_answer(completion)
        args = (self.dataset_name, self.config, answer, entry)
        on_expiry = lambda why: ("score", _scored_zero(self.dataset_name, answer, why))
        outcome, value = call_bounded(_SCORER, args, SCORE_TIMEOUT_S, on_expiry)
        while outcome == "unprepared":  # a fresh worker: it makes the scorer first, outside the answer's bound
            call_bounded(_PREPARE, (self.dataset_name, self.config), PREPARE_TIMEOUT_S, self._not_prepared)
            outcome, value = call_bounded(_SCORER, args, SCORE_TIMEOUT_S, on_expiry)
        if outcome == "score":
            return value
        # Some reasoning-gym scorers parse the answer themselves and raise on text they cannot parse
        # (prime_factorization's int(), boxnet's dict access). If the reference answer scores without an
        # error, the model's answer is unparseable: a legitimate 0. If it fails too, the scorer or the entry
        # is broken, and that error stops the run.
        if entry.get("answer") is not None:
            self._scorer.score_answer(entry["answer"], entry)
        return 0.0

    def _not_prepared(self, why: str) -> None:
        raise DatasetError(f"reasoning-gym dataset {self.dataset_name!r}: making its scorer {why}")


def _scored_zero(dataset: str, answer: str | None, why: str) -> float:
    count_stopped(f"reasoning-gym {dataset}: scoring {str(answer)[:200]!r} {why}; it scores 0")
    return 0.0


@dataclass(frozen=True)
class MixtureEnvironment:
    """Several environments, each problem drawn from one with probability weight / sum of weights.

    `components` maps a name to (environment, weight); the name becomes the problem's
    metadata["source"] and the prefix of its id, and `score` routes by it. Problem `index` of stream
    `seed` picks its component from Random((seed, index)) and asks it for its problem `index` of
    stream derive_seed31(seed, name), so a component's problems do not depend on the other components.
    """

    components: Mapping[str, tuple[ProblemGenerator, float]]
    name: str = "mixture"

    def __post_init__(self) -> None:
        if not self.components:
            raise ValueError("MixtureEnvironment needs at least one component")
        for key, (_, weight) in self.components.items():
            if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight > 0):
                raise ValueError(f"MixtureEnvironment: weight of {key!r} must be a positive number, got {weight!r}")

    def generate(self, seed: int, index: int) -> Problem:
        names = list(self.components)
        key = random.Random(f"mixture-{seed}-{index}").choices(names, [self.components[k][1] for k in names])[0]
        problem = self.components[key][0].generate(derive_seed31(seed, key), index)
        return replace(problem, id=f"{key}-{seed}-{index}", metadata={**problem.metadata, "source": key})

    def score(self, completion: str, problem: Problem) -> float:
        return _route(self.routes(), problem).score(completion, problem)

    def routes(self) -> dict[str, ProblemGenerator]:
        """The environment scoring each metadata["source"] this mixture produces (nested mixtures flattened)."""
        return _routes(env if isinstance(env, MixtureEnvironment) else {key: env}
                       for key, (env, _) in self.components.items())


class EnvironmentReward:
    """The reward of environment problems: each problem is scored by the environment named by its
    metadata["source"]. `envs` is one environment, several, or a mapping source -> environment;
    mixtures contribute their components. A problem from no known environment is an error."""

    def __init__(self, envs: ProblemGenerator | Iterable[ProblemGenerator] | Mapping[str, ProblemGenerator]) -> None:
        if isinstance(envs, Mapping):
            parts: Iterable[Any] = [envs]
        elif isinstance(envs, ProblemGenerator):
            parts = [envs]
        else:
            parts = list(envs)
        self.routes = _routes(parts)
        if not self.routes:
            raise ValueError("EnvironmentReward needs at least one environment")

    def __call__(self, completion: str, problem: Problem) -> float:
        score = float(_route(self.routes, problem).score(completion, problem))
        if not math.isfinite(score):
            raise ValueError(f"environment {problem.metadata.get('source')!r} scored problem {problem.id!r} {score}")
        return score


def _routes(parts: Iterable[Any]) -> dict[str, ProblemGenerator]:
    routes: dict[str, ProblemGenerator] = {}
    for part in parts:
        if isinstance(part, MixtureEnvironment):
            found = part.routes()
        elif isinstance(part, Mapping):
            found = {}
            for key, env in part.items():
                found.update(env.routes() if isinstance(env, MixtureEnvironment) else {key: env})
        else:
            found = {part.name: part}
        for key, env in found.items():
            if key in routes and routes[key] is not env:
                raise ValueError(f"two environments are named {key!r}; give them distinct names")
            routes[key] = env
    return routes


def _route(routes: Mapping[str, ProblemGenerator], problem: Problem) -> ProblemGenerator:
    source = problem.metadata.get("source")
    if source not in routes:
        raise ValueError(f"problem {problem.id!r} has metadata['source']={source!r}, which no environment scores "
                         f"(environments: {', '.join(sorted(routes))})")
    return routes[source]


def make_environment(name: str, config: Mapping[str, Any] | None = None) -> ProblemGenerator:
    """An environment by name: "package.module:factory" (called with `config`), else a reasoning-gym dataset."""
    config = dict(config or {})
    if ":" in name:
        module_name, _, attribute = name.partition(":")
        factory = getattr(importlib.import_module(module_name), attribute, None)
        if factory is None:
            raise DatasetError(f"environment {name!r}: module {module_name!r} has no {attribute!r}")
        env = factory(**config)
        if not isinstance(env, ProblemGenerator):
            raise DatasetError(f"environment {name!r} made a {type(env).__name__}, which lacks name/generate/score")
        return env
    return ReasoningGymEnvironment(name, **config)


def make_mixture(weights: Mapping[str, float], configs: Mapping[str, Mapping[str, Any]] | None = None) -> ProblemGenerator:
    """One environment per name of `weights` (see make_environment, with configs[name]), mixed by weight;
    a single name is that environment itself."""
    configs = configs or {}
    if unknown := sorted(set(configs) - set(weights)):
        raise DatasetError(f"settings for {', '.join(unknown)}, which is not in the mixture ({', '.join(weights)})")
    envs = {name: (make_environment(name, configs.get(name)), weight) for name, weight in weights.items()}
    if len(envs) == 1:
        return next(iter(envs.values()))[0]
    return MixtureEnvironment(envs)


def environment_from_spec(spec: str, config: str | Mapping[str, Any] = "") -> ProblemGenerator:
    """The environment a config string names: "NAME" (a reasoning-gym dataset or "package.module:factory")
    or a mixture "NAME=WEIGHT,NAME=WEIGHT". `config` (a JSON object, or a dict) holds the settings: of the
    one environment, or per name for a mixture, e.g. '{"basic_arithmetic": {"max_digits": 3}}'."""
    settings = json.loads(config) if isinstance(config, str) and config.strip() else dict(config or {})
    if not isinstance(settings, dict):
        raise DatasetError(f"environment settings must be a JSON object, got {config!r}")
    parts = [part.strip() for part in spec.split(",") if part.strip()]
    if not parts:
        raise DatasetError("no environment named: set NAME (a reasoning-gym dataset or package.module:factory) "
                           "or NAME=WEIGHT,NAME=WEIGHT")
    if len(parts) == 1 and "=" not in parts[0]:
        return make_environment(parts[0], settings)
    weights = {}
    for part in parts:
        name, _, weight = part.partition("=")
        try:
            weights[name.strip()] = float(weight)
        except ValueError as exc:
            raise DatasetError(f"environment mixture {spec!r}: write NAME=WEIGHT, got {part!r}") from exc
    return make_mixture(weights, settings)


def leveled_environment_task(spec: str, levels: Sequence[Mapping[str, Any]], *, train_size: int, test_size: int,
                             seed: int = 0, prompt_template: str = "{prompt}") -> Task:
    """One environment at several difficulty settings, easiest first: level k's problems are made
    with `levels[k]` as the environment's settings and carry metadata["difficulty"] = k, so that a
    pass-rate curriculum (sampling.problems=pass_rate) raises the difficulty as accuracy rises.
    Each level gets an equal share of `train_size` and `test_size` (the first levels one more)."""
    if not levels:
        raise DatasetError("leveled_environment_task: no levels")
    train: list[Problem] = []
    test: list[Problem] = []
    for level, settings in enumerate(levels):
        task = environment_task(environment_from_spec(spec, dict(settings)),
                                train_size=_share(train_size, len(levels), level),
                                test_size=_share(test_size, len(levels), level), seed=derive_seed31(seed, "level", level),
                                prompt_template=prompt_template)
        for problems, split in ((train, task.train), (test, task.test)):
            problems.extend(replace(p, id=f"level{level}-{p.id}", metadata={**p.metadata, "difficulty": level})
                            for p in split)
    test_prompts = {prompt_text(p) for p in test}  # levels are drawn apart: keep them apart across levels too
    return Task(name=f"{spec}-levels", train=[p for p in train if prompt_text(p) not in test_prompts], test=test)


def _share(total: int, parts: int, index: int) -> int:
    return total // parts + (1 if index < total % parts else 0)
