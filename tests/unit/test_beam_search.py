"""PRM-guided step-level beam search on a scripted step generator and a scripted PRM, against a
hand-traced search (Snell et al. 2024: N beams, width M, keep N/M, last-step PRM score)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from reasonrl.eval.search import (
    Beam,
    BeamConfig,
    StepSample,
    TextContinuation,
    TokenContinuation,
    beam_search,
    chat_prompt,
)
from reasonrl.types import Completion, Group, Problem, SamplingParams

PROBLEM = Problem(id="p0", prompt="2+3?", answer="5")


def step(text: str, end: str = "delimiter") -> StepSample:
    # One token per character, so a search's token count is the sum of its samples' lengths.
    return StepSample(text=text, token_ids=tuple(range(len(text))), logprobs=(-0.5,) * len(text),
                      end=end)  # type: ignore[arg-type]


class ScriptedSteps:
    """The continuations of each prefix text, the first n of them; records every call."""

    def __init__(self, by_prefix: dict[str, list[StepSample]]):
        self.by_prefix = by_prefix
        self.calls: list[tuple[list[str], SamplingParams]] = []

    def extend(self, prefixes: Sequence[tuple[Problem, Beam]], sampling: SamplingParams) -> list[list[StepSample]]:
        self.calls.append(([beam.text for _, beam in prefixes], sampling))
        return [self.by_prefix[beam.text][: sampling.n] for _, beam in prefixes]


class ScriptedPRM:
    """Scores a step by a table of step texts; records the step lists it was asked about."""

    def __init__(self, by_step: dict[str, float]):
        self.by_step = by_step
        self.seen: list[list[list[str]]] = []

    def score_steps(self, problem: Problem, steps_per_completion: Sequence[Sequence[str]]) -> list[list[float]]:
        self.seen.append([list(steps) for steps in steps_per_completion])
        return [[self.by_step[s] for s in steps] for steps in steps_per_completion]


# The script, N = 4 beams of width M = 2 (keep N/M = 2 growing beams per round):
#
# round 1: "" -> a, b, c, d (each ends at "\n\n").  Last-step scores a .9, b .2, c .6, d .4: keep a, c.
# round 2: a -> x (.3), "answer 7" (.8, ends the solution);  c -> y (.7), "answer 5" (.5, ends).
#          finished: a|answer 7 (.8), c|answer 5 (.5).  growing: c|y (.7), a|x (.3): both kept, c|y first.
# round 3: c|y -> "answer 5" (.5), "answer 5" (.5): both finished.
#          a|x -> "answer 5" (.5, ends),  "zz" (cut by the 2-token step cap: the step stays open).
#          "zz" is scored as the step "zz" (.1); it is the only growing beam: kept.
# round 4: a|x|zz -> 4 samples (it gets all N): "z\n\n" closes the open step as "zzz\n\n" (.2), and
#          "z answer 9" x3 continue it into the step "zzz answer 9" (.4, end).  max_steps = 4: the
#          growing a|x|zzz is cut and finishes too.
# Finished, by score: a|answer 7 .8, then the .5 "answer 5"s in the order sampled (c|answer 5 of round 2,
# c|y|answer 5 twice, a|x|answer 5), the .4 "zzz answer 9"s, a|x|zzz .2. The N = 4 best are kept.
SCRIPT = {
    "": [step("a\n\n"), step("b\n\n"), step("c\n\n"), step("d\n\n")],
    "a\n\n": [step("x\n\n"), step("answer 7", "eos")],
    "c\n\n": [step("y\n\n"), step("answer 5", "eos")],
    "c\n\ny\n\n": [step("answer 5", "eos"), step("answer 5", "eos")],
    "a\n\nx\n\n": [step("answer 5", "eos"), step("zz", "length")],
    "a\n\nx\n\nzz": [step("z\n\n"), step("z answer 9", "eos"), step("z answer 9", "eos"), step("z answer 9", "eos")],
}
SCORES = {"a": 0.9, "b": 0.2, "c": 0.6, "d": 0.4, "x": 0.3, "y": 0.7, "answer 7": 0.8, "answer 5": 0.5, "zz": 0.1,
          "zzz": 0.2, "zzz answer 9": 0.4}


def run(config: BeamConfig) -> tuple[list, ScriptedSteps, ScriptedPRM]:
    generator, prm = ScriptedSteps(SCRIPT), ScriptedPRM(SCORES)
    return beam_search(generator, prm, [PROBLEM], config, seed=7), generator, prm


def test_beam_search_keeps_the_best_beams_each_round() -> None:
    [result], generator, prm = run(BeamConfig(beams=4, width=2, max_steps=4, max_step_tokens=8))
    # Round by round, the prefixes extended (best first) and the sample count each got.
    assert [(texts, sampling.n) for texts, sampling in generator.calls] == [
        ([""], 4), (["a\n\n", "c\n\n"], 2), (["c\n\ny\n\n", "a\n\nx\n\n"], 2), (["a\n\nx\n\nzz"], 4)]
    assert all(sampling.stop == ("\n\n",) for _, sampling in generator.calls)
    # The PRM sees the steps stripped; the open step "zz" + "z\n\n" is one step "zzz".
    assert prm.seen[0] == [["a"], ["b"], ["c"], ["d"]]
    assert prm.seen[3][0] == ["a", "x", "zzz"]
    assert [(beam.text, beam.score) for beam in result.solutions] == [
        ("a\n\nanswer 7", 0.8), ("c\n\nanswer 5", 0.5), ("c\n\ny\n\nanswer 5", 0.5), ("c\n\ny\n\nanswer 5", 0.5)]
    assert result.solutions[0].steps == ("a\n\n", "answer 7")
    assert result.solutions[0].step_scores == (0.9, 0.8)
    assert result.solutions[0].completion().finish_reason == "stop"
    assert result.rounds == 4
    # Steps sampled: 4 + 2*2 + 2*2 + 4 = 16. Tokens (one per character): round 1: 4 * 3 = 12;
    # round 2: 3 + 8 + 3 + 8 = 22; round 3: 8 + 8 + 8 + 2 = 26; round 4: 3 + 3 * 10 = 33. Total 93.
    assert result.samples == 16
    assert result.tokens == 93
    assert len(result.solutions[2].token_ids) == len("c\n\ny\n\nanswer 5")


def test_the_step_limit_cuts_growing_beams() -> None:
    # With max_steps = 1 the first round's beams are all cut: four "length" solutions, best first.
    [result], generator, _ = run(BeamConfig(beams=4, width=2, max_steps=1))
    assert len(generator.calls) == 1
    assert [(beam.text, beam.finish) for beam in result.solutions] == [
        ("a\n\n", "length"), ("c\n\n", "length"), ("d\n\n", "length"), ("b\n\n", "length")]
    assert result.solutions[0].completion().finish_reason == "length"


def test_min_aggregation_scores_by_the_weakest_step() -> None:
    # One beam of width 1 takes each prefix's first continuation: a (.9), then a|x (.3), then
    # a|x|answer 5 (.5, ends). Under "min" it scores min(.9, .3, .5) = .3; under "last" .5.
    for aggregate, expected in (("min", 0.3), ("last", 0.5)):
        [result], generator, _ = run(BeamConfig(beams=1, width=1, max_steps=3, aggregate=aggregate))
        assert [texts for texts, _ in generator.calls] == [[""], ["a\n\n"], ["a\n\nx\n\n"]]
        assert [(beam.text, beam.score) for beam in result.solutions] == [("a\n\nx\n\nanswer 5", expected)]
        assert result.solutions[0].finish == "eos"


def test_a_token_allowance_splits_the_generator_calls() -> None:
    # max_new_tokens = 10: after "a\n\n" (3 tokens) 7 are left, after "c\n\n" also 7; the step cap is 8,
    # so round 2 asks for min(8, 7) = 7 tokens.
    _, generator, _ = run(BeamConfig(beams=4, width=2, max_steps=2, max_new_tokens=10, max_step_tokens=8))
    assert [sampling.max_new_tokens for _, sampling in generator.calls] == [8, 7]


def test_bad_config_and_short_generator_fail() -> None:
    with pytest.raises(ValueError, match="aggregate"):
        BeamConfig(beams=4, aggregate="median")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="beams >= 1"):
        BeamConfig(beams=0)
    short = ScriptedSteps({"": [step("a\n\n")]})
    with pytest.raises(ValueError, match="sampling.n"):
        beam_search(short, ScriptedPRM(SCORES), [PROBLEM], BeamConfig(beams=4, width=2))


class EchoEngine:
    """A RolloutEngine that answers every prompt with the same completions, as HFEngine reports
    them: the text cut before the stop string, the token ids (one per character) not."""

    def __init__(self, decoded: list[tuple[str, str]]):
        self.decoded = decoded  # (full decode of the ids, finish reason)
        self.prompts: list[str] = []

    def generate(self, problems: Sequence[Problem], sampling: SamplingParams) -> list[Group]:
        self.prompts.extend(str(p.prompt) for p in problems)
        completions = []
        for full, finish in self.decoded[: sampling.n]:
            text = full
            for s in sampling.stop:
                text = text.split(s)[0]
            completions.append(Completion(token_ids=tuple(ord(ch) for ch in full), text=text,
                                          logprobs=(0.0,) * len(full), finish_reason=finish))  # type: ignore[arg-type]
        return [Group(problem=p, prompt_ids=(), completions=tuple(completions)) for p in problems]

    def load_weights(self, named_tensors) -> None:
        pass


def test_text_continuation_keeps_the_delimiter_and_tells_the_ends_apart() -> None:
    engine = EchoEngine([("6*7\n\n", "stop"), ("=42", "stop"), ("6*", "length")])
    generator = TextContinuation(engine, decode=lambda ids: "".join(chr(i) for i in ids))
    [row] = generator.extend([(PROBLEM, Beam(text="Step 1\n\n"))], SamplingParams(n=3, stop=("\n\n",)))
    assert engine.prompts == ["2+3?Step 1\n\n"]
    assert [(s.text, s.end) for s in row] == [("6*7\n\n", "delimiter"), ("=42", "eos"), ("6*", "length")]
    assert row[0].token_ids == tuple(ord(ch) for ch in "6*7\n\n")


def test_token_continuation_continues_the_exact_ids() -> None:
    def chars(ids):
        return "".join(chr(i) for i in ids)

    seen = []

    def continue_from(ids_per_prefix, sampling):
        seen.extend(list(ids) for ids in ids_per_prefix)
        # The engine's text is cut before the stop string; its ids are not.
        full = [("x=1\n\n", "stop"), ("done", "stop")]
        return [[Completion(token_ids=tuple(map(ord, text)), text=text.split("\n\n")[0], logprobs=(0.0,) * len(text),
                            finish_reason=finish) for text, finish in full[: sampling.n]] for _ in ids_per_prefix]

    generator = TokenContinuation(prompt_ids=lambda problem: [1, 2], continue_from=continue_from, decode=chars)
    beam = Beam(text="ab", token_ids=(97, 98))
    [row] = generator.extend([(PROBLEM, beam)], SamplingParams(n=2, stop=("\n\n",)))
    assert seen == [[1, 2, 97, 98]]  # the prompt's ids, then the beam's: nothing tokenised again
    assert [(s.text, s.end) for s in row] == [("x=1\n\n", "delimiter"), ("done", "eos")]


class LengthPRM:
    """Scores a step by its length: longer steps score higher."""

    def score_steps(self, problem: Problem, steps_per_completion: Sequence[Sequence[str]]) -> list[list[float]]:
        return [[len(s) / 10 for s in steps] for steps in steps_per_completion]


@pytest.mark.parametrize("mode", ["text", "exact"])
def test_beam_search_over_a_tiny_model_spells_its_tokens(tiny_model_dir, mode: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reasonrl.commands.eval import _step_generator
    from reasonrl.rollout.hf import HFEngine

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    if mode == "exact":
        engine = HFEngine(model, tokenizer)
        if not callable(getattr(engine, "continue_from", None)):
            pytest.skip("this HFEngine does not continue from token ids")
        generator = _step_generator(engine, tokenizer)
    else:
        generator = TextContinuation(HFEngine(model, tokenizer, chat_template=False),
                                     decode=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True),
                                     render=chat_prompt(tokenizer))
    # The random model rarely writes "e": a 3-token step cap makes most steps; 8 tokens end a solution.
    config = BeamConfig(beams=4, width=2, delimiter="e", max_step_tokens=3, max_new_tokens=8, temperature=1.0)
    [result] = beam_search(generator, LengthPRM(), [PROBLEM], config, seed=0)
    assert 1 <= len(result.solutions) <= 4
    for beam in result.solutions:
        # The steps join into the text, which is the decode of the beam's own token ids.
        assert "".join(beam.steps) == beam.text == tokenizer.decode(list(beam.token_ids), skip_special_tokens=True)
        assert len(beam.token_ids) == len(beam.logprobs) <= 8
    assert result.samples == 4 * result.rounds


def test_chat_prompt_renders_the_template_with_the_assistant_turn_open(tiny_model_dir) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert chat_prompt(tokenizer)(PROBLEM) == "<|user|>2+3?<eos><|assistant|>"


# ---- the search's answers, as `reasonrl eval` reports them ----------------------------------------

def test_beam_curves_answer_by_best_solution_and_by_weighted_majority(tmp_path) -> None:
    from reasonrl.eval.cache import BeamCache
    from reasonrl.eval.run import EvalSettings, beam_curves
    from reasonrl.rewards import MathReward, WeightedReward

    settings = EvalSettings(n=1, tts=("beam", "beam_majority"), budgets=(4,), beam_width=2, max_steps=4,
                            max_step_tokens=8)
    reward = WeightedReward({"correct": (MathReward(), 1.0)})
    cache = BeamCache(tmp_path / "beams.jsonl", "model")
    generator = ScriptedSteps(SCRIPT)
    curves = beam_curves(generator, ScriptedPRM(SCORES), "t", [PROBLEM], reward, settings, cache, progress=False)
    # The four solutions of the traced search: "answer 7" (.8) and three "answer 5" (.5 each); gold 5.
    # beam: the PRM's best says 7, wrong. beam_majority: 5 totals 1.5 > 0.8, right.
    # Compute: 93 tokens and 16 sampled steps over 4 rounds (see the trace above).
    assert curves == {
        "beam": [{"budget": 4.0, "accuracy": 0.0, "samples": 4.0, "tokens": 93.0, "step_samples": 16.0,
                  "rounds": 4.0, "vote_timeouts": 0.0}],
        "beam_majority": [{"budget": 4.0, "accuracy": 1.0, "samples": 4.0, "tokens": 93.0, "step_samples": 16.0,
                           "rounds": 4.0, "vote_timeouts": 0.0}],
    }
    # A second evaluation reads the searches from the cache: the generator is not called again.
    calls = len(generator.calls)
    again = beam_curves(generator, ScriptedPRM(SCORES), "t", [PROBLEM], reward, settings,
                        BeamCache(tmp_path / "beams.jsonl", "model"), progress=False)
    assert again == curves and len(generator.calls) == calls


def test_beam_settings_are_checked_before_sampling() -> None:
    from reasonrl.eval.run import EvalSettings

    # Beam budgets are numbers of beams: they may exceed n, unless a pool method shares them.
    EvalSettings(n=2, tts=("beam",), budgets=(1, 16))
    with pytest.raises(ValueError, match="between 1 and n=2"):
        EvalSettings(n=2, tts=("beam", "majority"), budgets=(1, 16))
    with pytest.raises(ValueError, match="--budget"):
        EvalSettings(n=2, tts=("beam",))
    with pytest.raises(ValueError, match="aggregate"):
        EvalSettings(n=2, tts=("beam",), budgets=(4,), prm_aggregate="median")
