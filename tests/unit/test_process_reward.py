"""Process rewards: step splitting, aggregation, outcome gating, step scores on tokens, the
Math-Shepherd-style PRM against a hand computation from its logits, and DeepSeekMath's
process-supervision advantage."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from helpers import build_tiny_model

from reasonrl.rewards.compose import WeightedReward
from reasonrl.rewards.prm import ClassifierPRM, ModelPRM
from reasonrl.rewards.process import (
    ProcessReward,
    Step,
    process_grpo,
    split_steps,
    step_end_tokens,
)
from reasonrl.types import Completion, Problem

torch.set_num_threads(1)

PROBLEM = Problem(id="p0", prompt="What is 6 * 7?", answer="42")


class ScriptedScorer:
    """Scores step k of every completion with scores[k] (in order), and counts its calls."""

    def __init__(self, by_text: dict[str, float]):
        self.by_text = by_text
        self.calls = 0

    def score_steps(self, problem: Problem, steps_per_completion: Sequence[Sequence[str]]) -> list[list[float]]:
        self.calls += 1
        return [[self.by_text[step] for step in steps] for steps in steps_per_completion]


def completion(text: str, token_ids: Sequence[int] = ()) -> Completion:
    return Completion(token_ids=tuple(token_ids), text=text, logprobs=(0.0,) * len(token_ids), finish_reason="stop")


# ---- splitting -------------------------------------------------------------------------------

def test_split_lines_skips_blank_lines_and_strips() -> None:
    text = "  a = 6\n\n b = 7 \nanswer 42"
    steps = split_steps(text, mode="lines")
    assert [s.text for s in steps] == ["a = 6", "b = 7", "answer 42"]
    assert steps[0] == Step("a = 6", 2, 7)
    assert steps[1] == Step("b = 7", 10, 15)
    assert all(text[s.start:s.end] == s.text for s in steps)
    assert steps[-1].end == len(text)


def test_split_double_newline_keeps_paragraphs() -> None:
    text = "first line\nstill first\n\n\nsecond\n \nthird\n"
    steps = split_steps(text, mode="double_newline")
    assert [s.text for s in steps] == ["first line\nstill first", "second", "third"]
    assert all(text[s.start:s.end] == s.text for s in steps)


def test_split_step_markers_with_preamble() -> None:
    text = "Let me think.\nStep 1: 6 * 7\nis 42\n## Step 2. so 42\nstep 3) done"
    steps = split_steps(text, mode="step_markers")
    assert [s.text for s in steps] == ["Let me think.", "Step 1: 6 * 7\nis 42", "## Step 2. so 42", "step 3) done"]
    assert all(text[s.start:s.end] == s.text for s in steps)


def test_split_custom_delimiter_and_errors() -> None:
    text = "a ки b ки c"
    assert [s.text for s in split_steps(text, mode="delimiter", delimiter="ки")] == ["a", "b", "c"]
    assert [s.end for s in split_steps(text, mode="delimiter", delimiter="ки")] == [1, 6, 11]
    with pytest.raises(ValueError, match="delimiter"):
        split_steps(text, mode="delimiter")
    with pytest.raises(ValueError, match="unknown mode"):
        split_steps(text, mode="sentences")  # type: ignore[arg-type]
    assert split_steps("  \n\n ", mode="lines") == []


# ---- aggregation and gating ------------------------------------------------------------------

SCORES = {"s1": 0.9, "s2": 0.5, "s3": 0.8}


@pytest.mark.parametrize(("aggregate", "expected"), [
    ("min", 0.5),                       # Math-Shepherd: the weakest step
    ("mean", (0.9 + 0.5 + 0.8) / 3),    # 0.7333...
    ("last", 0.8),
    ("product", 0.9 * 0.5 * 0.8),       # Lightman et al.: P(every step correct) = 0.36
])
def test_aggregations(aggregate: str, expected: float) -> None:
    reward = ProcessReward(ScriptedScorer(SCORES), aggregate=aggregate)
    scores = reward.score_group(PROBLEM, [completion("s1\ns2\ns3"), completion("s3"), completion("\n")])
    assert scores[0] == pytest.approx(expected, abs=1e-12)
    assert scores[1] == pytest.approx(0.8)  # one step: every aggregate is that step's score
    assert scores[2] == 0.0  # no steps, nothing to reward


def test_custom_split_function() -> None:
    by_semicolon = lambda text: split_steps(text, mode="delimiter", delimiter=";")
    reward = ProcessReward(ScriptedScorer(SCORES), split=by_semicolon, aggregate="product")
    assert reward.score_group(PROBLEM, [completion("s1; s2")]) == [pytest.approx(0.45)]  # 0.9 * 0.5


def test_unknown_aggregate_and_short_scorer_fail() -> None:
    with pytest.raises(ValueError, match="aggregate"):
        ProcessReward(ScriptedScorer(SCORES), aggregate="max")  # type: ignore[arg-type]

    class Short:
        def score_steps(self, problem, steps_per_completion):
            return [[0.5] for _ in steps_per_completion]

    with pytest.raises(ValueError, match="every step"):
        ProcessReward(Short()).score_group(PROBLEM, [completion("s1\ns2")])


def test_outcome_gate_zeroes_wrong_answers() -> None:
    scores = {"x = 42": 0.6, "x = 41": 0.9, "so": 0.3}
    correct = lambda text, problem: 1.0 if text.endswith(problem.answer) else 0.0
    reward = ProcessReward(ScriptedScorer(scores), aggregate="mean", gated_by=correct)
    assert reward.score_group(PROBLEM, [completion("so\nx = 42"), completion("so\nx = 41")]) == [
        pytest.approx((0.3 + 0.6) / 2), 0.0]


# ---- step scores on tokens -------------------------------------------------------------------

@pytest.fixture(scope="module")
def char_tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_step_scores_on_last_token_of_each_step(char_tokenizer) -> None:
    # One token per character: "s1\n\ns2\ns3" has steps s1 (chars 0-1), s2 (4-5), s3 (7-8); each
    # score lands on its step's last character's token and the newlines get 0.
    text = "s1\n\ns2\ns3"
    ids = char_tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)
    scorer = ScriptedScorer(SCORES)
    reward = ProcessReward(scorer, aggregate="min", tokenizer=char_tokenizer)
    [values] = reward.score_tokens(PROBLEM, [completion(text, ids)])
    assert len(values) == len(ids)
    assert values == [0.0, 0.9, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.8]
    assert reward.score_group(PROBLEM, [completion(text, ids)]) == [0.5]
    assert scorer.calls == 1  # both views of one group share one scoring


def test_text_cut_at_stop_string_and_special_tokens(char_tokenizer) -> None:
    # The engine keeps the tokens of the stop string "\nEND" and the EOS but cuts them from the
    # text: steps are placed through the decode of the ids, the trailing tokens get 0.
    ids = char_tokenizer.encode("s1\ns2\nEND", add_special_tokens=False) + [char_tokenizer.eos_token_id]
    reward = ProcessReward(ScriptedScorer(SCORES), tokenizer=char_tokenizer)
    [values] = reward.score_tokens(PROBLEM, [completion("s1\ns2", ids)])
    assert len(values) == len(ids) == 10
    assert values == [0.0, 0.9, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert step_end_tokens(split_steps("s1\ns2"), completion("s1\ns2", ids), char_tokenizer) == [1, 4]


def test_steps_land_where_a_scan_of_every_prefix_puts_them(char_tokenizer) -> None:
    # Random lines of random lengths (one token a character here): the galloping search finds, for
    # each step, the first prefix whose decode holds the step, as a scan of every prefix does.
    import random

    rng = random.Random(0)
    text = "\n".join("".join(rng.choice("ab =+") for _ in range(rng.randint(1, 9))) for _ in range(40)).strip()
    ids = char_tokenizer.encode(text, add_special_tokens=False)
    steps = split_steps(text, mode="lines")
    decode = lambda count: char_tokenizer.decode(ids[:count], skip_special_tokens=True)
    scanned = [next(k - 1 for k in range(1, len(ids) + 1) if decode(k).startswith(text[:step.end])) for step in steps]
    assert step_end_tokens(steps, completion(text, ids), char_tokenizer) == scanned


def test_thousands_of_one_token_steps_stop_at_the_bound_and_are_counted(char_tokenizer) -> None:
    # "x\n" x 4000 took over 20 s (a binary search of whole-prefix decodes per step); past the
    # bound the steps left end at the last token, and the completion counts as a timeout.
    from reasonrl.rewards.bounded import timeouts_on_this_thread

    text = "x\n" * 4000
    ids = char_tokenizer.encode(text, add_special_tokens=False)
    steps = split_steps(text, mode="lines")
    before, started = timeouts_on_this_thread(), time.monotonic()
    ends = step_end_tokens(steps, completion(text, ids), char_tokenizer, started + 0.2)
    assert time.monotonic() - started < 0.2 + 1.0
    assert timeouts_on_this_thread() == before + 1
    assert len(ends) == len(steps) and ends[-1] == len(ids) - 1
    placed = [end for end in ends if end != len(ids) - 1]
    assert 0 < len(placed) and placed == [2 * k for k in range(len(placed))]  # the steps placed are right


def test_a_group_s_completions_share_one_time_for_their_steps(char_tokenizer, monkeypatch) -> None:
    # Four completions of 4000 one-line steps: each alone would take its own bound; together they
    # take the group's one, and every completion whose steps it cut counts as a timeout.
    from reasonrl.rewards import process
    from reasonrl.rewards.bounded import timeouts_on_this_thread

    monkeypatch.setattr(process, "PLACEMENT_BUDGET_S", 0.2)
    text = "x\n" * 4000
    ids = char_tokenizer.encode(text, add_special_tokens=False)
    reward = ProcessReward(ScriptedScorer(defaultdict(lambda: 1.0)), tokenizer=char_tokenizer, split="lines")
    before, started = timeouts_on_this_thread(), time.monotonic()
    dense = reward.score_tokens(PROBLEM, [completion(text, ids)] * 4)
    assert time.monotonic() - started < 0.2 + 1.0
    assert timeouts_on_this_thread() == before + 4
    assert [sum(row) for row in dense] == [4000.0] * 4  # every step's score placed, the cut ones on the last token
    # The first spent the group's time: the others' steps all end at the last token (each with its own
    # time, each would have placed some).
    assert dense[0][-1] < 4000.0 and [row[-1] for row in dense[1:]] == [4000.0] * 3


def test_text_that_is_not_the_decode_of_the_ids_fails(char_tokenizer) -> None:
    ids = char_tokenizer.encode("s1\ns2", add_special_tokens=False)
    reward = ProcessReward(ScriptedScorer(SCORES), tokenizer=char_tokenizer)
    with pytest.raises(ValueError, match="not a prefix"):
        reward.score_tokens(PROBLEM, [completion("s2\ns1", ids)])
    with pytest.raises(ValueError, match="tokenizer"):
        ProcessReward(ScriptedScorer(SCORES)).score_tokens(PROBLEM, [completion("s1", ids[:2])])


def test_gate_zeroes_every_step_reward_in_the_token_view(char_tokenizer) -> None:
    gate = lambda text, problem: float(text != "s1\ns2")
    reward = ProcessReward(ScriptedScorer(SCORES), gated_by=gate, tokenizer=char_tokenizer)
    texts = ["s1\ns2", "s2\ns3"]
    completions = [completion(t, char_tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    assert reward.score_tokens(PROBLEM, completions) == [[0.0] * 5, [0.0, 0.5, 0.0, 0.0, 0.8]]


def test_in_weighted_reward_the_outcome_adds_on_the_last_token(char_tokenizer) -> None:
    outcome = lambda text, problem: 1.0
    reward = WeightedReward({"process": (ProcessReward(ScriptedScorer(SCORES), tokenizer=char_tokenizer), 0.5),
                             "outcome": (outcome, 1.0)})
    ids = char_tokenizer.encode("s1\ns3", add_special_tokens=False)
    scores = reward.score_group(PROBLEM, [completion("s1\ns3", ids)])
    assert scores.totals == (pytest.approx(0.5 * 0.8 + 1.0),)  # min(0.9, 0.8) = 0.8
    # 0.5 * 0.9 on "1"; 0.5 * 0.8 + 1.0 on the last token "3".
    assert scores.token_rewards == ((0.0, pytest.approx(0.45), 0.0, 0.0, pytest.approx(1.4)),)


# ---- the PRM ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Larger initial weights than the shared tiny model, so P(+) moves well away from 1/2.
    return build_tiny_model(tmp_path_factory.mktemp("tiny-prm"), seed=3, initializer_range=0.5)


@pytest.fixture(scope="module")
def prm(prm_dir: Path) -> ModelPRM:
    return ModelPRM.from_pretrained(str(prm_dir), batch_size=1)


def test_prm_score_is_softmax_of_good_and_bad_logits_at_each_tag(prm: ModelPRM) -> None:
    steps = ["6*7", "=42"]
    [scores] = prm.score_steps(PROBLEM, [steps])
    # The input is "What is 6 * 7? 6*7\n\n=42\n\n", one token per character (no BOS): the tags' last
    # characters (the second newlines) are at 19 and 24,
    # and P(good) = exp(z+) / (exp(z+) + exp(z-)) of the logits there.
    text = "What is 6 * 7? 6*7\n\n=42\n\n"
    ids = prm.tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)
    with torch.no_grad():
        logits_TV = prm.model(torch.tensor([ids])).logits[0]
    plus, minus = prm.tokenizer.convert_tokens_to_ids(["+", "-"])
    expected = [math.exp(logits_TV[t, plus]) / (math.exp(logits_TV[t, plus]) + math.exp(logits_TV[t, minus]))
                for t in (19, 24)]
    assert scores == pytest.approx(expected, abs=1e-5)
    assert max(abs(p - 0.5) for p in expected) > 0.01  # the test can tell good from bad


def test_prm_scores_do_not_depend_on_batching(prm: ModelPRM, prm_dir: Path) -> None:
    steps = [["6*7", "=42"], [], ["Step 1: 6*7 is\n\nforty-two", "Step 2: 42", "done"], ["x"]]
    one_by_one = prm.score_steps(PROBLEM, steps)
    batched = ModelPRM(prm.model, prm.tokenizer, batch_size=3).score_steps(PROBLEM, steps)
    assert [len(row) for row in one_by_one] == [2, 0, 3, 1]  # a tag inside a step adds no score
    for row_a, row_b in zip(one_by_one, batched):
        assert row_a == pytest.approx(row_b, abs=1e-5)


def test_prm_math_shepherd_tag_and_token_checks(prm: ModelPRM) -> None:
    shepherd = ModelPRM(prm.model, prm.tokenizer, step_tag=" #", step_separator="\n")
    # Math-Shepherd's layout "question s1 ки\ns2 ки", with "#" for "ки": the tags are scored at the "#" tokens.
    [scores] = shepherd.score_steps(PROBLEM, [["s1", "s2"]])
    ids, tags = shepherd.fmt.encode(prm.tokenizer, PROBLEM, ["s1", "s2"])
    assert prm.tokenizer.decode(ids) == "What is 6 * 7? s1 #\ns2 #"
    assert [prm.tokenizer.decode([ids[t]]) for t in tags] == ["#", "#"]
    assert len(scores) == 2
    with pytest.raises(ValueError, match="one id"):
        ModelPRM(prm.model, prm.tokenizer, positive_token="++")


def test_classifier_prm_reads_the_label_probability_at_each_tag(prm_dir: Path) -> None:
    torch.manual_seed(0)
    classifier = ClassifierPRM.from_pretrained(str(prm_dir), label=1, batch_size=2, num_labels=2)
    model = classifier.model
    with torch.no_grad():
        model.score.weight.normal_(0.0, 3.0)  # a fresh head is near zero; spread its logits
    scores = classifier.score_steps(PROBLEM, [["6*7", "=42"], ["x"], []])
    # The tags' last characters are at 19 and 24 as in the PRM test; P(label 1) = e^z1 / (e^z0 + e^z1) there.
    ids = classifier.tokenizer.encode("What is 6 * 7? 6*7\n\n=42\n\n", add_special_tokens=False)
    with torch.no_grad():
        logits_TL = model(torch.tensor([ids])).logits[0]
    expected = [math.exp(z1) / (math.exp(z0) + math.exp(z1)) for z0, z1 in logits_TL[[19, 24]].tolist()]
    assert scores[0] == pytest.approx(expected, abs=1e-5)
    assert max(abs(p - 0.5) for p in expected) > 0.01
    alone = ClassifierPRM(model, classifier.tokenizer, batch_size=1).score_steps(PROBLEM, [["x"]])
    assert scores[1] == pytest.approx(alone[0], abs=1e-5)  # batched with a longer row, padded
    assert scores[2] == []


def test_process_reward_with_prm_end_to_end(prm: ModelPRM, char_tokenizer) -> None:
    text = "6*7\n=42"
    ids = char_tokenizer.encode(text, add_special_tokens=False)
    reward = ProcessReward(prm, aggregate="product", tokenizer=char_tokenizer)
    [step_scores] = prm.score_steps(PROBLEM, [["6*7", "=42"]])
    assert reward.score_group(PROBLEM, [completion(text, ids)]) == [pytest.approx(step_scores[0] * step_scores[1])]
    assert reward.score_tokens(PROBLEM, [completion(text, ids)]) == [
        [0.0, 0.0, pytest.approx(step_scores[0]), 0.0, 0.0, 0.0, pytest.approx(step_scores[1])]]


# ---- process-supervision GRPO ----------------------------------------------------------------

def test_process_grpo_matches_deepseekmath() -> None:
    # Group 0: row 0 has steps ending at t=1 (r=1) and t=3 (r=0); row 1 at t=0 (r=0) and t=2 (r=1).
    # R = {1, 0, 0, 1}: mean 1/2, unbiased std sqrt(4 * 1/4 / 3) = 1/sqrt(3), so
    # r~ = +-(1/2) * sqrt(3) = +-0.8660 for r = 1 / 0. A_t = sum of r~ of the steps ending at or after t:
    #   row 0: t<=1: 0.866 - 0.866 = 0; t=2,3: -0.866; t=4 is off the mask.
    #   row 1: t=0: -0.866 + 0.866 = 0; t=1,2: 0.866; t>=3 off the mask.
    # The step of row 1 at t=0 scores 0 and still counts in R: the step mask, not the value, says
    # which tokens end steps. Group 1 (rows 2, 3): equal step rewards, advantage 0.
    h = math.sqrt(3) / 2
    rewards_NT = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0],
                               [0.0, 0.0, 1.0, 0.0, 0.0],
                               [0.0, 0.7, 0.0, 0.0, 0.0],
                               [0.7, 0.0, 0.0, 0.0, 0.0]])
    step_mask_NT = torch.tensor([[0, 1, 0, 1, 0], [1, 0, 1, 0, 0], [0, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    mask_NT = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    advantages_NT = process_grpo(rewards_NT, mask_NT, step_mask_NT=step_mask_NT, group_N=torch.tensor([0, 0, 1, 1]),
                                 eps=0.0)
    expected_NT = torch.tensor([[0.0, 0.0, -h, -h, 0.0],
                                [0.0, h, h, 0.0, 0.0],
                                [0.0] * 5,
                                [0.0] * 5])
    torch.testing.assert_close(advantages_NT, expected_NT)


def test_step_ending_in_a_character_split_over_two_tokens() -> None:
    # A byte-level tokenizer may split "€" (3 UTF-8 bytes) over two tokens; the first prefix decodes
    # to "a\ufffd", as long as "a€" but not it: the step "a€" ends on token 2, where "€" is complete.
    class Bytes:
        pieces = (b"a", b"\xe2\x82", b"\xac", b"\n", b"b")

        def decode(self, ids, skip_special_tokens=True):
            return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")

    text = "a€\nb"
    done = completion(text, range(5))
    assert step_end_tokens(split_steps(text), done, Bytes()) == [2, 4]
