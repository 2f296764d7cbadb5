"""Step labels by Monte Carlo rollouts, the training data of a process reward model (Wang et al.
2024, "Math-Shepherd: Verify and Reinforce LLMs Step-by-step without Human Annotations", §3.2).

For each problem q, `samples` solutions are drawn and each is cut into steps s_1..s_n with the
splitters of the process reward (`rewards.process.split_steps`). The value of step i is estimated
from K completions a_1..a_K sampled from the prefix (q, s_1..s_i):

    soft label  y_i = (1/K) * sum_j 1[a_j reaches a verified answer]      (Math-Shepherd's SE)
    hard label  y_i = 1 if some a_j reaches a verified answer, else 0      (Math-Shepherd's HE)

A completion "reaches a verified answer" when the verifier scores the whole solution (the prefix's
text followed by the completion) at least 1, so a code solution passing half its tests does not.

The prefix is the prompt's ids followed by the solution's own token ids up to the token that
completes step i (`rewards.process.step_end_tokens`): the sampled tokens, never re-tokenised, and
the engine's `continue_from` prefills each prefix once for its K completions. The last step of a
solution that ended by itself (finish reason "stop") is not continued: its prefix is the whole
solution, so both of its labels are the solution's own verdict. The last step of a cut solution
(finish reason "length") is continued like the others.

Labels are written to a JSONL file, one line per solution (`LabeledSolution`), all the solutions
of a problem in one write: a re-run skips the problems already in the file, so an interrupted run
resumes where it stopped (a line cut by the interruption is dropped).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from tqdm.auto import tqdm

from reasonrl.rewards.compose import score_completions
from reasonrl.rewards.process import SplitMode, split_steps, step_end_tokens
from reasonrl.seeds import derive_seed
from reasonrl.types import Completion, GroupReward, Problem, RewardFn, SamplingParams, is_solution


class PrefixEngine(Protocol):
    """An engine that continues token-id prefixes (e.g. `rollout.hf.HFEngine`)."""

    tokenizer: Any

    def prompt_ids(self, problem: Problem) -> list[int]: ...

    def continue_from(self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams,
                      seeds: Sequence[int] | None = None) -> list[list[Completion]]: ...


@dataclass(frozen=True)
class LabelSettings:
    """`samples` solutions per problem, `continuations` (K) completions per step, `split` how a
    solution is cut into steps; the sampling knobs apply to solutions and completions alike."""

    samples: int = 4
    continuations: int = 8
    split: SplitMode = "lines"
    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 512
    stop: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if self.samples < 1 or self.continuations < 1:
            raise ValueError(f"step labels need samples >= 1 and continuations >= 1, got samples={self.samples}, "
                             f"continuations={self.continuations}")
        if self.max_new_tokens < 1:
            raise ValueError(f"step labels need max_new_tokens >= 1, got {self.max_new_tokens}")
        split_steps("", mode=self.split)  # an unknown mode fails here, not after the first problem

    def sampling(self, n: int) -> SamplingParams:
        return SamplingParams(n=n, temperature=self.temperature, top_p=self.top_p,
                              max_new_tokens=self.max_new_tokens, stop=self.stop, seed=self.seed)


@dataclass(frozen=True)
class LabeledSolution:
    """One sampled solution with its steps and their labels (one line of the labels file)."""

    problem_id: str
    prompt: Any  # the problem's prompt as given: text or chat messages
    answer: str
    solution: str
    steps: list[str]
    soft: list[float]
    hard: list[int]
    continuations: int
    correct: bool  # the solution's own verdict

    def problem(self) -> Problem:
        return Problem(id=self.problem_id, prompt=self.prompt, answer=self.answer)

    @classmethod
    def from_json(cls, row: dict[str, Any], where: str) -> LabeledSolution:
        try:
            labeled = cls(**row)
        except TypeError as exc:
            raise ValueError(f"{where}: not a step-labels row ({exc}); write it with `reasonrl label-steps`") from None
        if not len(labeled.steps) == len(labeled.soft) == len(labeled.hard):
            raise ValueError(f"{where}: {len(labeled.steps)} steps but {len(labeled.soft)} soft and "
                             f"{len(labeled.hard)} hard labels")
        return labeled


def label_problem(engine: PrefixEngine, verifier: RewardFn | GroupReward, problem: Problem,
                  settings: LabelSettings) -> list[LabeledSolution]:
    """The labeled solutions of one problem (seeds derive from settings.seed and the problem id, so
    a problem's labels do not depend on which other problems are labeled)."""
    prompt = list(engine.prompt_ids(problem))
    solutions = engine.continue_from([prompt], settings.sampling(settings.samples),
                                     [derive_seed(settings.seed, "solutions", problem.id)])[0]
    verdicts = [is_solution(value, None) for value in score_completions(verifier, problem, solutions)]
    steps = [split_steps(s.text, mode=settings.split) for s in solutions]
    # Each solution its own time: labels are data, and one hostile solution must not move every other
    # solution's steps to its last token.
    ends = [step_end_tokens(row, s, engine.tokenizer) for row, s in zip(steps, solutions)]
    # Which (solution, step) prefixes are continued: all but the last step of a finished solution.
    continued = [(g, k) for g, s in enumerate(solutions) for k in range(len(steps[g]))
                 if not (k == len(steps[g]) - 1 and s.finish_reason == "stop")]
    successes = _successes(engine, verifier, problem, settings, prompt, solutions, ends, continued)
    labeled = []
    for g, solution in enumerate(solutions):
        soft = [successes[(g, k)] / settings.continuations if (g, k) in successes else float(verdicts[g])
                for k in range(len(steps[g]))]
        labeled.append(LabeledSolution(
            problem_id=problem.id, prompt=problem.prompt, answer=problem.answer, solution=solution.text,
            steps=[step.text for step in steps[g]], soft=soft, hard=[int(value > 0) for value in soft],
            continuations=settings.continuations, correct=verdicts[g]))
    return labeled


def _successes(engine: PrefixEngine, verifier: RewardFn | GroupReward, problem: Problem, settings: LabelSettings,
               prompt: list[int], solutions: Sequence[Completion], ends: Sequence[Sequence[int]],
               continued: Sequence[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """For each continued (solution g, step k), how many of its K completions are verified."""
    if not continued:
        return {}
    heads = [list(solutions[g].token_ids[:ends[g][k] + 1]) for g, k in continued]
    seeds = [derive_seed(settings.seed, "steps", problem.id, g, k) for g, k in continued]
    tails = engine.continue_from([prompt + head for head in heads], settings.sampling(settings.continuations), seeds)
    whole = [_joined(engine.tokenizer, head, tail, settings.stop) for head, row in zip(heads, tails) for tail in row]
    values = score_completions(verifier, problem, whole)
    K = settings.continuations
    return {key: sum(is_solution(value, None) for value in values[i * K:(i + 1) * K]) for i, key in enumerate(continued)}


def _joined(tokenizer: Any, head: list[int], tail: Completion, stop: Sequence[str]) -> Completion:
    """The solution prefix `head` followed by the completion `tail`, as one completion whose text is
    the decode of all its ids (cut at a stop string, as the engine cuts), so the verifier reads
    exactly what the model would have written."""
    ids = (*head, *tail.token_ids)
    text = tokenizer.decode(list(ids), skip_special_tokens=True)
    for s in stop:
        text = text.split(s, 1)[0]
    return Completion(token_ids=ids, text=text, logprobs=(0.0,) * len(head) + tuple(tail.logprobs),
                      finish_reason=tail.finish_reason)


def label_steps(engine: PrefixEngine, verifier: RewardFn | GroupReward, problems: Sequence[Problem],
                out: str | Path, settings: LabelSettings, *, progress: bool = True) -> Path:
    """Label the steps of `settings.samples` solutions of every problem into the JSONL file `out`,
    skipping the problems already written there (resume). Returns `out`."""
    ids = [p.id for p in problems]
    if len(set(ids)) != len(ids):
        duplicated = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"step labels resume by problem id, but ids repeat: {duplicated[:5]}; give each problem "
                         "its own id")
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    done = written_problem_ids(path)
    todo = [p for p in problems if p.id not in done]
    bar = tqdm(total=len(problems), initial=len(problems) - len(todo), desc="label-steps", unit="problem",
               disable=not progress)
    with path.open("a", encoding="utf-8") as file:
        for problem in todo:
            rows = label_problem(engine, verifier, problem, settings)
            file.write("".join(json.dumps(asdict(row), ensure_ascii=False) + "\n" for row in rows))
            file.flush()
            bar.update()
    bar.close()
    return path


def written_problem_ids(path: Path) -> set[str]:
    """The problem ids already in a labels file; a last line cut by an interruption (no newline) is
    removed from the file, so its problem is labeled again."""
    if not path.exists():
        return set()
    data = path.read_bytes()
    complete = data[:data.rfind(b"\n") + 1]
    if len(complete) != len(data):
        with path.open("r+b") as file:
            file.truncate(len(complete))
            os.fsync(file.fileno())
    return {row.problem_id for row in _rows(complete.decode("utf-8"), str(path))}


def read_step_labels(path: str | Path) -> list[LabeledSolution]:
    """The labeled solutions of a file written by `label_steps`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"step labels {str(path)!r} not found; write them with `reasonrl label-steps`")
    return _rows(path.read_text(encoding="utf-8"), str(path))


def _rows(text: str, where: str) -> list[LabeledSolution]:
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}:{number}: not JSON ({exc})") from None
            rows.append(LabeledSolution.from_json(row, f"{where}:{number}"))
    return rows


__all__ = ["LabelSettings", "LabeledSolution", "PrefixEngine", "label_problem", "label_steps", "read_step_labels",
           "written_problem_ids"]
