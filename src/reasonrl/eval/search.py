"""PRM-guided step-level beam search (Snell et al. 2024, "Scaling LLM Test-Time Compute Optimally can be
More Effective than Scaling Model Parameters", section 3 and appendix; the search of Lightman et al. 2023,
"Let's Verify Step by Step", as released in Hugging Face's "search-and-learn").

With N beams and a beam width M, per problem:

1. sample N first steps (a step ends at the step delimiter, e.g. "\\n\\n", at the end of the
   solution, or at `max_step_tokens`);
2. a process reward model (`rewards.process.StepScorer`) scores every partial solution, its step
   scores aggregated by `aggregate` ("last": the PRM's score of the newest step, Snell et al.'s
   choice; or "min", "mean", "product");
3. finished candidates (end of solution, or the token limit) leave the search; of the others the
   N/M best are kept, and each gets M continuations of one more step (N/M does not have to divide
   evenly: the N samples of a round are spread over the kept beams as equally as possible, the best
   beams first, as search-and-learn duplicates its active beams up to N);
4. repeat until no beam is left or after `max_steps` rounds (the beams still growing then end
   there, cut).

The solutions are the finished candidates, the N best by score (search-and-learn keeps the same);
the final answer is the best one's, or the answer with the largest total score (PRM-weighted
majority), both chosen in `eval.run`. Compute is counted as the tokens generated and the steps
sampled, pruned candidates included.

A step that the per-step token cap cuts before its delimiter stays open: the next round continues
the same step, and the PRM sees it as one step.

The search asks a `StepGenerator` to continue partial solutions. `TextContinuation` does it over any
`RolloutEngine`: the partial solution is appended to the prompt as text and the engine samples
from there, so the prefix is tokenised again (with a BPE tokenizer a step's delimiter may then
tokenise differently from how it was sampled, and the policy sees token sequences it did not
produce). `TokenContinuation` continues the exact token ids (`Beam.token_ids`, which the search
keeps) through an engine that samples from given ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from reasonrl.rewards.process import AGGREGATES, Aggregate, StepScorer
from reasonrl.types import Completion, Problem, RolloutEngine, SamplingParams

StepEnd = Literal["delimiter", "eos", "length"]


@dataclass(frozen=True)
class StepSample:
    """One sampled continuation of a partial solution: its text (the step delimiter included when
    the step ended at it), generated token ids and their log-probs, and why it ended."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    end: StepEnd


@dataclass(frozen=True)
class Beam:
    """A partial (or finished) solution: its text, token ids and log-probs, its steps (as
    generated, delimiters included), the PRM's step scores and their aggregate `score`."""

    text: str = ""
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    steps: tuple[str, ...] = ()
    open_step: bool = False  # the last step was cut by the per-step cap; the next round continues it
    finish: Literal["eos", "length"] | None = None  # None: still growing
    step_scores: tuple[float, ...] = ()
    score: float = 0.0

    def completion(self) -> Completion:
        return Completion(token_ids=self.token_ids, text=self.text, logprobs=self.logprobs,
                          finish_reason="stop" if self.finish == "eos" else "length")


class StepGenerator(Protocol):
    """Continues partial solutions by one step."""

    def extend(self, prefixes: Sequence[tuple[Problem, Beam]], sampling: SamplingParams) -> list[list[StepSample]]:
        """`sampling.n` continuations of each (problem, partial solution), stopping at `sampling.stop`
        or after `sampling.max_new_tokens` tokens, in order."""
        ...


@dataclass(frozen=True)
class BeamConfig:
    """The search's settings; `beams` is N, the compute budget (the number of solutions)."""

    beams: int
    width: int = 4
    delimiter: str = "\n\n"
    aggregate: Aggregate = "last"
    max_steps: int = 40
    max_step_tokens: int = 256
    max_new_tokens: int = 2048
    temperature: float = 0.8
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.beams < 1 or self.width < 1:
            raise ValueError(f"beam search needs beams >= 1 and width >= 1, got beams={self.beams}, width={self.width}")
        if self.aggregate not in AGGREGATES:
            raise ValueError(f"beam search: unknown step-score aggregate {self.aggregate!r}; use one of "
                             f"{', '.join(AGGREGATES)}")
        if not self.delimiter:
            raise ValueError("beam search needs a non-empty step delimiter, e.g. '\\n\\n'")
        if min(self.max_steps, self.max_step_tokens, self.max_new_tokens) < 1:
            raise ValueError("beam search: max_steps, max_step_tokens and max_new_tokens must all be >= 1")

    @property
    def keep(self) -> int:
        """How many unfinished beams survive a round: N/M, at least one."""
        return max(1, self.beams // self.width)


@dataclass(frozen=True)
class BeamResult:
    """A problem's solutions (best score first) and the compute the search spent on it."""

    problem: Problem
    solutions: tuple[Beam, ...]
    tokens: int  # generated tokens, pruned candidates included
    samples: int  # sampled steps, pruned candidates included
    rounds: int


def beam_search(generator: StepGenerator, scorer: StepScorer, problems: Sequence[Problem], config: BeamConfig, *,
                seed: int = 0) -> list[BeamResult]:
    """Search every problem at once (one `extend` call per round and token allowance serves all of them)."""
    kept: list[list[Beam]] = [[Beam()] for _ in problems]
    done: list[list[Beam]] = [[] for _ in problems]
    tokens, samples, rounds = [0] * len(problems), [0] * len(problems), [0] * len(problems)
    for round_index in range(config.max_steps):
        requests = [(p, beam, count) for p, beams in enumerate(kept)
                    for beam, count in zip(beams, _spread(config.beams, len(beams)))]
        if not requests:
            break
        candidates: list[list[Beam]] = [[] for _ in problems]
        extended = _extend_all(generator, problems, requests, config, seed, round_index)
        for (p, beam, _), continuations in zip(requests, extended):
            for sample in continuations:
                candidates[p].append(_grow(beam, sample, config, last_round=round_index + 1 == config.max_steps))
                tokens[p] += len(sample.token_ids)
                samples[p] += 1
        for p, problem in enumerate(problems):
            if not candidates[p]:
                continue
            rounds[p] += 1
            scored = _score(scorer, problem, candidates[p], config.aggregate)
            done[p].extend(beam for beam in scored if beam.finish is not None)
            growing = [beam for beam in scored if beam.finish is None]
            kept[p] = _best(growing, config.keep)
    return [BeamResult(problem=problem, solutions=tuple(_best(done[p], config.beams)), tokens=tokens[p],
                       samples=samples[p], rounds=rounds[p]) for p, problem in enumerate(problems)]


def _spread(total: int, parts: int) -> list[int]:
    """`total` samples over `parts` beams (best first), as equal as possible: 8 over 3 -> [3, 3, 2]."""
    return [total // parts + (i < total % parts) for i in range(parts)] if parts else []


def _best(beams: Sequence[Beam], count: int) -> list[Beam]:
    """The `count` highest-scoring beams; ties keep the order they were sampled in."""
    order = sorted(range(len(beams)), key=lambda i: -beams[i].score)
    return [beams[i] for i in order[:count]]


def _extend_all(generator: StepGenerator, problems: Sequence[Problem], requests: Sequence[tuple[int, Beam, int]],
                config: BeamConfig, seed: int, round_index: int) -> list[list[StepSample]]:
    """Continuations of every request; requests that share a sample count and a token allowance
    (the step cap, or what is left of the solution's tokens) go to the generator together."""
    batches: dict[tuple[int, int], list[int]] = {}
    for index, (_, beam, count) in enumerate(requests):
        allowance = min(config.max_step_tokens, config.max_new_tokens - len(beam.token_ids))
        batches.setdefault((count, allowance), []).append(index)
    out: list[list[StepSample]] = [[] for _ in requests]
    for (count, allowance), indices in sorted(batches.items()):
        digest = hashlib.sha256(f"{seed}/{round_index}/{count}/{allowance}".encode()).hexdigest()
        sampling = SamplingParams(n=count, temperature=config.temperature, top_p=config.top_p,
                                  max_new_tokens=allowance, stop=(config.delimiter,), seed=int(digest[:12], 16))
        prefixes = [(problems[requests[i][0]], requests[i][1]) for i in indices]
        results = generator.extend(prefixes, sampling)
        if len(results) != len(indices) or any(len(row) != count for row in results):
            raise ValueError(f"beam search: the step generator returned {[len(row) for row in results]} continuations "
                             f"for {len(indices)} prefixes x {count}; it must return sampling.n for each prefix")
        for i, row in zip(indices, results):
            out[i] = row
    return out


def _grow(beam: Beam, sample: StepSample, config: BeamConfig, *, last_round: bool) -> Beam:
    steps = (*beam.steps[:-1], beam.steps[-1] + sample.text) if beam.open_step else (*beam.steps, sample.text)
    token_ids = beam.token_ids + sample.token_ids
    finish: Literal["eos", "length"] | None = None
    if sample.end == "eos":
        finish = "eos"
    elif len(token_ids) >= config.max_new_tokens or last_round:
        finish = "length"
    return replace(beam, text=beam.text + sample.text, token_ids=token_ids, logprobs=beam.logprobs + sample.logprobs,
                   steps=steps, open_step=sample.end == "length", finish=finish)


def _score(scorer: StepScorer, problem: Problem, beams: Sequence[Beam], aggregate: Aggregate) -> list[Beam]:
    """The beams with the PRM's scores of their non-blank steps; a beam without one scores 0."""
    steps = [[step.strip() for step in beam.steps if step.strip()] for beam in beams]
    scores = scorer.score_steps(problem, steps)
    if len(scores) != len(beams) or any(len(row) != len(s) for row, s in zip(scores, steps)):
        raise ValueError(f"beam search: the PRM returned {[len(row) for row in scores]} scores for "
                         f"{[len(s) for s in steps]} steps of problem {problem.id!r}; it must score every step")
    return [replace(beam, step_scores=tuple(row), score=AGGREGATES[aggregate](row) if row else 0.0)
            for beam, row in zip(beams, scores)]


def plain_prompt(problem: Problem) -> str:
    """A text prompt as it is (for an engine that reads prompts verbatim, without a chat template)."""
    if not isinstance(problem.prompt, str):
        raise TypeError(f"problem {problem.id!r} is a chat conversation; continuing it as text needs the chat "
                         "template rendered: TextContinuation(engine, decode, render=chat_prompt(tokenizer))")
    return problem.prompt


def chat_prompt(tokenizer: Any) -> Callable[[Problem], str]:
    """The prompt rendered through the tokenizer's chat template with the assistant turn opened,
    as text an engine without a chat template continues. A leading BOS the tokenizer adds anyway
    is dropped so it is not doubled."""
    if not getattr(tokenizer, "chat_template", None):
        return plain_prompt
    bos = getattr(tokenizer, "bos_token", None)
    adds_bos = bos is not None and tokenizer("", add_special_tokens=True)["input_ids"][:1] == [tokenizer.bos_token_id]

    def render(problem: Problem) -> str:
        messages = [{"role": "user", "content": problem.prompt}] if isinstance(problem.prompt, str) else [
            dict(m) for m in problem.prompt]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return text[len(bos):] if adds_bos and text.startswith(bos) else text

    return render


def _step_sample(completion: Completion, text: str, stop: Sequence[str]) -> StepSample:
    """A continuation as a step: `text` is the full decode of its tokens (engines cut a stop string
    from `Completion.text`; the step keeps its delimiter so the steps join back into what the tokens
    spell), and it ended at a delimiter when the engine stopped and the cut-off part holds one."""
    if not completion.token_ids and completion.text:
        raise ValueError("beam search needs an engine that returns the generated token ids (HFEngine), to tell a "
                         "step's delimiter from the end of the solution and to count tokens")
    cut = text.removeprefix(completion.text)
    if completion.finish_reason == "stop":
        end: StepEnd = "delimiter" if any(s in cut for s in stop) else "eos"
    else:
        end = "length"
    return StepSample(text=text, token_ids=completion.token_ids, logprobs=completion.logprobs, end=end)


@dataclass(frozen=True)
class TextContinuation:
    """A `StepGenerator` over any `RolloutEngine` that returns token ids: each prefix becomes a
    problem whose text prompt is `render(problem)` + the partial solution, which an engine without a
    chat template (`HFEngine(..., chat_template=False)`) continues. `decode(token_ids)` is the
    policy tokenizer's decode, special tokens skipped."""

    engine: RolloutEngine
    decode: Callable[[Sequence[int]], str]
    render: Callable[[Problem], str] = plain_prompt

    def extend(self, prefixes: Sequence[tuple[Problem, Beam]], sampling: SamplingParams) -> list[list[StepSample]]:
        continued = [replace(problem, prompt=self.render(problem) + beam.text) for problem, beam in prefixes]
        groups = self.engine.generate(continued, sampling)
        return [[_step_sample(c, self.decode(c.token_ids), sampling.stop) for c in group.completions]
                for group in groups]


@dataclass(frozen=True)
class TokenContinuation:
    """A `StepGenerator` that continues the exact token ids: the prompt's ids (`prompt_ids(problem)`,
    e.g. `HFEngine.prompt_ids`) followed by the beam's generated ids, sampled from by
    `continue_from(token_ids_per_prefix, sampling)` (e.g. `HFEngine.continue_from`: `sampling.n`
    completions of each prefix, in order). A step's text is the decode of the beam's ids with the
    new ones minus the decode without them, so a solution's text is the decode of all its ids."""

    prompt_ids: Callable[[Problem], Sequence[int]]
    continue_from: Callable[[Sequence[Sequence[int]], SamplingParams], Sequence[Sequence[Completion]]]
    decode: Callable[[Sequence[int]], str]

    def extend(self, prefixes: Sequence[tuple[Problem, Beam]], sampling: SamplingParams) -> list[list[StepSample]]:
        ids = [[*self.prompt_ids(problem), *beam.token_ids] for problem, beam in prefixes]
        out = []
        for (_, beam), completions in zip(prefixes, self.continue_from(ids, sampling), strict=True):
            before = self.decode(beam.token_ids)
            out.append([_step_sample(c, self.decode([*beam.token_ids, *c.token_ids]).removeprefix(before),
                                     sampling.stop) for c in completions])
        return out
