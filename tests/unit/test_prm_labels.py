"""Monte Carlo step labels (Math-Shepherd): soft and hard labels derived by hand from a scripted
engine whose continuations are fixed strings, resume, and a smoke run through the real HF engine."""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from helpers import char_tokenizer

from reasonrl.stages.prm_labels import LabelSettings, label_steps, read_step_labels
from reasonrl.types import Completion, Problem, SamplingParams

torch.set_num_threads(1)

PROBLEM = Problem(id="p0", prompt="Q:", answer="42")


def ends_with_answer(text: str, problem: Problem) -> float:
    return float(text.strip().endswith(problem.answer))


class ScriptedEngine:
    """Continues a prefix with fixed strings: script[text of the prefix after the prompt] holds the
    texts of its n continuations. Records every (prefix text, n) it is asked for."""

    def __init__(self, script: dict[str, list[str]], finish: dict[str, str] | None = None):
        self.tokenizer = char_tokenizer(string.printable)
        self.script, self.finish = script, finish or {}
        self.calls: list[tuple[str, int]] = []

    def prompt_ids(self, problem: Problem) -> list[int]:
        return self.tokenizer(problem.prompt, add_special_tokens=False)["input_ids"]

    def continue_from(self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams,
                      seeds: Sequence[int] | None = None) -> list[list[Completion]]:
        out = []
        for prefix in prefixes:
            text = self.tokenizer.decode(list(prefix)).removeprefix(PROBLEM.prompt)
            self.calls.append((text, sampling.n))
            texts = self.script[text]
            assert len(texts) == sampling.n
            out.append([self._completion(t) for t in texts])
        return out

    def _completion(self, text: str) -> Completion:
        ids = tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return Completion(token_ids=ids, text=text, logprobs=(0.0,) * len(ids),
                          finish_reason=self.finish.get(text, "stop"))  # type: ignore[arg-type]


SCRIPT = {
    "": ["a\nb\n42", "a\nx\n41", "a\nc"],          # three solutions (the third cut: finish "length")
    "a": ["\nb\n42", "\nb\n42", "\nb\n42", "\nno"],  # step 1 "a": 3 of 4 succeed
    "a\nb": ["\n41", "\n41", "\n41", "\n41"],        # step 2 of solution 1: none succeeds
    "a\nx": ["\n42", "\n0", "\n0", "\n0"],            # step 2 of solution 2: 1 of 4
    "a\nc": ["\n42", "\n42", "0", "0"],               # the cut solution's last step: 2 of 4
}


def test_labels_by_hand(tmp_path: Path) -> None:
    engine = ScriptedEngine(SCRIPT, finish={"a\nc": "length"})
    out = label_steps(engine, ends_with_answer, [PROBLEM], tmp_path / "labels.jsonl",
                      LabelSettings(samples=3, continuations=4), progress=False)
    rows = read_step_labels(out)
    assert [row.steps for row in rows] == [["a", "b", "42"], ["a", "x", "41"], ["a", "c"]]
    # Solution 1 is right: its last step is labeled by its own verdict, not continued.
    assert rows[0].soft == [0.75, 0.0, 1.0] and rows[0].hard == [1, 0, 1] and rows[0].correct
    assert rows[1].soft == [0.75, 0.25, 0.0] and rows[1].hard == [1, 1, 0] and not rows[1].correct
    # A cut solution's last step is continued: "a\nc" + "\n42" succeeds, "a\nc" + "0" ("...c0") does not.
    assert rows[2].soft == [0.75, 0.5] and rows[2].hard == [1, 1] and not rows[2].correct
    assert all(row.continuations == 4 and row.problem_id == "p0" and row.answer == "42" for row in rows)
    assert rows[0].solution == "a\nb\n42"
    continued = sorted(text for text, n in engine.calls if n == 4)
    assert continued == ["a", "a", "a", "a\nb", "a\nc", "a\nx"]  # one prefix per step, never "a\nb\n42"
    assert json.loads(out.read_text().splitlines()[0])["prompt"] == "Q:"


def test_resume_skips_written_problems_and_drops_a_cut_line(tmp_path: Path) -> None:
    script = {"": ["1\n42"], "1": ["\n42"]}
    problems = [Problem(id=f"p{i}", prompt="Q:", answer="42") for i in range(3)]
    out = tmp_path / "labels.jsonl"
    first = ScriptedEngine(script)
    label_steps(first, ends_with_answer, problems[:2], out, LabelSettings(samples=1, continuations=1), progress=False)
    with out.open("a") as file:
        file.write('{"problem_id": "p2", "prom')  # an interrupted write
    again = ScriptedEngine(script)
    label_steps(again, ends_with_answer, problems, out, LabelSettings(samples=1, continuations=1), progress=False)
    assert [row.problem_id for row in read_step_labels(out)] == ["p0", "p1", "p2"]
    assert len(again.calls) == 2  # p2 alone: its solution, then its first step
    assert [row.soft for row in read_step_labels(out)] == [[1.0, 1.0]] * 3


def test_bad_input_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="continuations >= 1"):
        LabelSettings(continuations=0)
    with pytest.raises(ValueError, match="unknown mode"):
        LabelSettings(split="sentences")  # type: ignore[arg-type]
    twice = [PROBLEM, PROBLEM]
    with pytest.raises(ValueError, match="ids repeat"):
        label_steps(ScriptedEngine(SCRIPT), ends_with_answer, twice, tmp_path / "x.jsonl", LabelSettings(),
                    progress=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem_id": "p0"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: not a step-labels row"):
        read_step_labels(bad)


def test_smoke_through_the_hf_engine(tiny_model_dir: Path, tmp_path: Path) -> None:
    from reasonrl.models import load_model, load_tokenizer
    from reasonrl.rollout.hf import HFEngine

    model = load_model(str(tiny_model_dir), dtype=torch.float32, device=torch.device("cpu"))
    engine = HFEngine(model, load_tokenizer(str(tiny_model_dir)))
    calls: list[tuple[int, int]] = []  # (prefixes, n) of each continue_from call
    finished: list[list[str]] = []  # each call's finish reasons
    continue_from = engine.continue_from

    def counted(prefixes, sampling, seeds=None):
        calls.append((len(prefixes), sampling.n))
        out = continue_from(prefixes, sampling, seeds)
        finished.append([c.finish_reason for row in out for c in row])
        return out

    engine.continue_from = counted  # type: ignore[method-assign]
    problems = [Problem(id=f"p{i}", prompt=f"{i}+1=", answer=str(i + 1)) for i in range(2)]
    settings = LabelSettings(samples=2, continuations=3, max_new_tokens=6, temperature=1.0, seed=3)
    out = label_steps(engine, ends_with_answer, problems, tmp_path / "labels.jsonl", settings, progress=False)
    rows = read_step_labels(out)
    assert [row.problem_id for row in rows] == ["p0", "p0", "p1", "p1"]
    # Per problem one call for its 2 solutions, then one for its steps' prefixes, 3 continuations each:
    # every step's, but the last step of a solution that ended by itself (finish "stop").
    ended = finished[0].count("stop")
    assert calls[0] == (1, 2) and calls[1] == (sum(len(row.steps) for row in rows[:2]) - ended, 3)
    for row in rows:
        assert len(row.steps) == len(row.soft) == len(row.hard)
        assert all(value in (0.0, 1 / 3, 2 / 3, 1.0) for value in row.soft)
        assert row.hard == [int(value > 0) for value in row.soft]
    again = label_steps(engine, ends_with_answer, problems, tmp_path / "again.jsonl", settings, progress=False)
    assert again.read_text() == out.read_text()  # seeds derive from the settings and the problem id


def test_a_benchmark_with_a_training_split_is_labeled_on_it_and_never_on_its_test_problems():
    # Labels from the test split would leak into the PRM wherever it is evaluated on that benchmark.
    from reasonrl.commands.prm import task_problems
    from reasonrl.tasks import benchmark_task

    labeled = task_problems("gsm8k", 5)
    assert [p.id for p in labeled] == [f"gsm8k-train-{i}" for i in range(5)]
    test_prompts = {p.prompt for p in benchmark_task("gsm8k", train_size=0).test}
    assert not any(p.prompt in test_prompts for p in task_problems("gsm8k", 200))
    assert [p.id for p in task_problems("math500", 2)] == [p.id for p in benchmark_task("math500", train_size=0).test[:2]]
