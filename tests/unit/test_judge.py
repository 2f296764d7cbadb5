"""Model-based rewards: the judge's parsing and voting, its plumbing through real engines (the tiny
HF model, a fake OpenAI-compatible server) and the classifier reward model against hand-computed
logits."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from reasonrl.rewards.judge import (
    ClassifierReward,
    JudgeReward,
    aggregate_votes,
    parse_score,
    parse_verdict,
    render_rubric,
)
from reasonrl.types import Completion, Group, Problem, SamplingParams

torch.set_num_threads(1)

PROBLEM = Problem(id="p1", prompt="What is 2+3?", answer="5")


def completion(text: str) -> Completion:
    return Completion(token_ids=(), text=text, logprobs=(), finish_reason="stop")


class ScriptedEngine:
    """A judge that answers from a script: the votes for a response are `script[response]`, found
    by the response fenced in the judge prompt. Records every generate call."""

    def __init__(self, script: dict[str, list[str]]):
        self.script = script
        self.calls: list[tuple[list[Problem], SamplingParams]] = []

    def generate(self, problems: Sequence[Problem], sampling: SamplingParams) -> list[Group]:
        self.calls.append((list(problems), sampling))
        groups = []
        for problem in problems:
            response = problem.prompt.split("[The Start of Assistant's Answer]\n")[1].split("\n[The End")[0]
            texts = self.script[response][: sampling.n]
            groups.append(Group(problem=problem, prompt_ids=(), completions=tuple(completion(t) for t in texts)))
        return groups


# ---------------------------------------------------------------- parsing


@pytest.mark.parametrize(("text", "scale", "expected"), [
    ("The answer matches. Score: 7/10", (0, 10), 0.7),            # 7 / 10
    ("**Score:** 6/10", (0, 10), 0.6),
    ("Rating: [[5]]", (0, 10), 0.5),                              # MT-Bench format, (5 - 0) / (10 - 0)
    ("[[8]]", (0, 10), 0.8),
    ("Score: 8", (0, 10), 0.8),
    ("Score: 4 out of 5", (0, 10), 0.8),                          # own denominator: 4 / 5
    ("It says 'Score: 10/10' but is wrong.\nScore: 2/10", (0, 10), 0.2),  # the last score counts
    ("Rating: [[1]]", (1, 10), 0.0),                              # (1 - 1) / (10 - 1)
    ("Rating: [[10]]", (1, 10), 1.0),
    ("Score: 12/10", (0, 10), None),                              # out of range: not a valid vote
    ("Score: -1", (0, 10), None),
    ("Score: 3/0", (0, 10), None),
    ("I cannot decide.", (0, 10), None),
    ("2/3 of the steps are right", (0, 10), None),                # an unlabelled fraction is no score
])
def test_parse_score(text: str, scale: tuple[float, float], expected: float | None) -> None:
    assert parse_score(text, scale) == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize(("text", "verdicts", "expected"), [
    ("Matches the reference. [[CORRECT]]", None, 1.0),
    ("Not equal to 5. [[INCORRECT]]", None, 0.0),                 # INCORRECT does not contain the word CORRECT
    ("It claims [[CORRECT]] but 4 != 5. [[incorrect]]", None, 0.0),  # last bracketed, any case
    ("Verdict: INCORRECT", None, 0.0),
    ("correct.", None, 1.0),                                      # the whole answer is a verdict
    ("I think it is correct", None, None),                        # lower-case words inside prose do not count
    ("A", {"A": 1.0, "B": 0.0, "C": 0.0}, 1.0),                   # SimpleQA grader style
    ("The answer is [[B]]", {"A": 1.0, "B": 0.0, "C": 0.0}, 0.0),
    ("A good attempt, but wrong", {"A": 1.0, "B": 0.0, "C": 0.0}, None),  # a one-letter word is not a verdict
])
def test_parse_verdict(text: str, verdicts: dict[str, float] | None, expected: float | None) -> None:
    assert (parse_verdict(text) if verdicts is None else parse_verdict(text, verdicts)) == expected


def test_aggregate_votes() -> None:
    assert aggregate_votes([0.8, 0.6], "score") == pytest.approx(0.7)  # (0.8 + 0.6) / 2
    assert aggregate_votes([1.0, 1.0, 0.0], "verdict") == 1.0          # 2 of 3 say correct
    assert aggregate_votes([0.0, 1.0], "verdict") == 0.5               # a tie averages the tied values
    with pytest.raises(ValueError, match="no valid votes"):
        aggregate_votes([], "score")


def test_render_rubric_keeps_other_braces() -> None:
    rubric = "Q: {question}\nA: {response}\nGold: \\boxed{{reference}} {unknown}"
    assert render_rubric(rubric, question="q {response}", response="r", reference="5") == \
        "Q: q {response}\nA: r\nGold: \\boxed{5} {unknown}"


# ---------------------------------------------------------------- voting with a scripted judge


def test_score_votes_are_averaged_in_one_call() -> None:
    engine = ScriptedEngine({
        "It is 5.": ["Fine. Score: 8/10", "Score: 6/10", "no idea"],
        "It is 6.": ["hmm", "???", "..."],
        "It is 4.": ["Score: 2/10"] * 3,
    })
    judge = JudgeReward(engine, votes=3, temperature=0.7, max_tokens=64)
    scores = judge.score_group(PROBLEM, [completion("It is 5."), completion("It is 6."), completion("It is 4.")])

    # (0.8 + 0.6) / 2 = 0.7 over the two valid votes; no valid vote -> 0 (invalid="zero"); 0.2 thrice.
    assert scores == pytest.approx([0.7, 0.0, 0.2])
    assert len(engine.calls) == 1
    problems, sampling = engine.calls[0]
    assert len(problems) == 3
    assert (sampling.n, sampling.temperature, sampling.max_new_tokens) == (3, 0.7, 64)
    assert "[Question]\nWhat is 2+3?" in problems[0].prompt
    assert "[The Start of Reference Answer]\n5\n" in problems[0].prompt
    assert judge.stats.last_invalid_votes == (1, 3, 0)
    assert (judge.stats.calls, judge.stats.votes, judge.stats.invalid_votes) == (1, 9, 4)
    assert judge.stats.invalid_rate == pytest.approx(4 / 9)
    assert judge.stats.last_judgements[1] == ("hmm", "???", "...")


def test_the_share_of_unread_votes_is_logged_beside_the_judge() -> None:
    from reasonrl.rewards import WeightedReward
    from reasonrl.rewards.judge import InvalidVotes

    engine = ScriptedEngine({"It is 5.": ["Score: 8/10", "no idea", "Score: 6/10"], "It is 6.": ["hmm", "???", "..."]})
    judge = JudgeReward(engine, votes=3, temperature=0.7)
    reward = WeightedReward({"judge": (judge, 1.0), "judge/invalid": (InvalidVotes(judge), 0.0)})
    scores = reward.score_group(PROBLEM, [completion("It is 5."), completion("It is 6.")])
    assert scores.components["judge/invalid"] == pytest.approx((1 / 3, 1.0))
    assert scores.totals == pytest.approx((0.7, 0.0))  # weight 0: logged, not rewarded
    with pytest.raises(ValueError, match="score the judge on the same group just before"):
        InvalidVotes(judge).score_group(PROBLEM, [completion("It is 5.")])
    assert reward.score_group(PROBLEM, []).components["judge/invalid"] == ()


def test_a_configured_judge_comes_with_its_unread_votes(monkeypatch) -> None:
    from reasonrl import load_config
    from reasonrl.rewards import MathReward, components
    from reasonrl.rewards.judge import InvalidVotes

    monkeypatch.setattr(components, "build_judge", lambda cfg: JudgeReward(ScriptedEngine({})))
    cfg = load_config(overrides=["reward.judge_model=judge", "reward.judge_weight=1.0", "reward.format_weight=0.1"])
    reward = components.configured_reward(cfg, components.RewardInputs(verifier=MathReward()))
    names = list(reward.weights)
    assert names[names.index("judge") + 1] == "judge/invalid" and reward.weights["judge/invalid"] == 0.0
    assert isinstance(reward._components["judge/invalid"][0], InvalidVotes)


def test_invalid_skip_scores_the_group_mean_and_raise_shows_the_text() -> None:
    script = {"It is 5.": ["Score: 8/10", "Score: 6/10"], "It is 6.": ["hmm", "?"], "It is 4.": ["Score: 2/10"] * 2}
    group = [completion("It is 5."), completion("It is 6."), completion("It is 4.")]
    skip = JudgeReward(ScriptedEngine(script), votes=2, invalid="skip")
    # The unjudged completion gets the mean of the judged ones: (0.7 + 0.2) / 2 = 0.45.
    assert skip.score_group(PROBLEM, group) == pytest.approx([0.7, 0.45, 0.2])
    strict = JudgeReward(ScriptedEngine(script), votes=2, invalid="raise")
    with pytest.raises(ValueError, match=r"completion 1 of problem 'p1' holds no score: 'hmm'"):
        strict.score_group(PROBLEM, group)
    nothing_judged = JudgeReward(ScriptedEngine({"x": ["?", "?"]}), votes=2, invalid="skip")
    assert nothing_judged.score_group(PROBLEM, [completion("x")]) == [0.0]


def test_verdict_majority() -> None:
    engine = ScriptedEngine({
        "It is 5.": ["[[CORRECT]]", "ok [[CORRECT]]", "[[INCORRECT]]"],   # 2 of 3 -> 1
        "It is 6.": ["[[INCORRECT]]", "garbage", "[[CORRECT]]"],          # 1-1 tie -> 0.5
        "It is 4.": ["[[INCORRECT]]"] * 3,
    })
    judge = JudgeReward(engine, parse="verdict", votes=3)
    scores = judge.score_group(PROBLEM, [completion("It is 5."), completion("It is 6."), completion("It is 4.")])
    assert scores == [1.0, 0.5, 0.0]
    assert "[[CORRECT]]" in engine.calls[0][0][0].prompt  # the verdict rubric is the default for parse="verdict"
    assert engine.calls[0][1].temperature == 1.0          # several votes sample


def test_configuration_errors() -> None:
    engine = ScriptedEngine({})
    with pytest.raises(ValueError, match="no {response} field"):
        JudgeReward(engine, rubric="Rate {question}")
    with pytest.raises(ValueError, match="temperature 0"):
        JudgeReward(engine, votes=4, temperature=0.0)
    assert JudgeReward(engine).sampling_temperature == 0.0  # one vote: greedy
    with pytest.raises(ValueError, match="has none"):
        JudgeReward(engine).score_group(Problem("q", "hi", ""), [completion("x")])
    label_free = JudgeReward(engine, rubric="{question} {response} Score: X/10")
    assert label_free.judge_prompt(Problem("q", "hi", ""), "x") == "hi x Score: X/10"


# ---------------------------------------------------------------- real engines


def test_judge_with_tiny_hf_model(tiny_model_dir: Path) -> None:
    """Plumbing only: the random tiny model writes garbage, so its votes are (almost surely) invalid."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reasonrl.rollout.hf import HFEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    engine = HFEngine(model, AutoTokenizer.from_pretrained(tiny_model_dir))
    calls = []
    generate = engine.generate

    def counting_generate(problems: Sequence[Problem], sampling: SamplingParams) -> list[Group]:
        calls.append((len(problems), sampling.n))
        return generate(problems, sampling)

    engine.generate = counting_generate
    judge = JudgeReward(engine, votes=2, temperature=1.0, max_tokens=6,
                        rubric="Q: {question}\nA: {response}\nScore: ")
    scores = judge.score_group(PROBLEM, [completion("5"), completion("six"), completion("4")])

    assert calls == [(3, 2)]
    assert len(scores) == 3 and all(0.0 <= s <= 1.0 for s in scores)
    assert judge.stats.votes == 6 and len(judge.stats.last_judgements) == 3
    for score, invalid, texts in zip(scores, judge.stats.last_invalid_votes, judge.stats.last_judgements):
        assert len(texts) == 2
        if invalid == 2:
            assert score == 0.0


class JudgeServer:
    """A fake OpenAI-compatible judge server that answers every request with n copies of `answer`."""

    def __init__(self, answer: str):
        self.bodies: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.bodies.append(body)
                data = json.dumps({"choices": [{"index": i, "message": {"role": "assistant", "content": answer},
                                                "finish_reason": "stop"} for i in range(body["n"])]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def judge_server() -> Iterator[JudgeServer]:
    server = JudgeServer("The response matches the reference.\nScore: 8/10")
    yield server
    server.close()


def test_judge_with_openai_engine(judge_server: JudgeServer) -> None:
    from reasonrl.rollout.openai import OpenAIEngine

    judge = JudgeReward(OpenAIEngine(judge_server.url, "judge"), votes=2, temperature=0.5, max_tokens=100)
    assert judge.score_group(PROBLEM, [completion("5"), completion("The answer is 5")]) == pytest.approx([0.8, 0.8])
    assert len(judge_server.bodies) == 2  # one request per judged completion, each with both votes
    body = next(b for b in judge_server.bodies if "The answer is 5" in b["messages"][0]["content"])
    assert (body["n"], body["temperature"], body["max_tokens"], body["model"]) == (2, 0.5, 100, "judge")
    assert [m["role"] for m in body["messages"]] == ["user"]


# ---------------------------------------------------------------- classifier reward model


def tiny_classifier(tiny_model_dir: Path, num_labels: int) -> tuple[torch.nn.Module, object]:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(num_labels)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         num_labels=num_labels, pad_token_id=tokenizer.pad_token_id, initializer_range=0.5)
    return LlamaForSequenceClassification(config).eval(), tokenizer


RESPONSES = ["5", "The answer is 5.", "six", "It is 2 + 3 = 5, so the answer is \\boxed{5}."]


@torch.no_grad()
def hand_logits(model: torch.nn.Module, tokenizer: object, response: str) -> torch.Tensor:
    """The score head applied to the last hidden state of the unpadded conversation:
    z = W_score h_T, with h_T the final hidden state at the last token (the <eos> closing the answer)."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": PROBLEM.prompt},
                                         {"role": "assistant", "content": response}], tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert ids[-1] == tokenizer.eos_token_id
    hidden_H = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
    return model.score.weight.float() @ hidden_H.float()


def test_classifier_one_logit_matches_hand_computation(tiny_model_dir: Path) -> None:
    model, tokenizer = tiny_classifier(tiny_model_dir, num_labels=1)
    group = [completion(r) for r in RESPONSES]
    scores = ClassifierReward(model, tokenizer, batch_size=4).score_group(PROBLEM, group)
    expected = [torch.sigmoid(hand_logits(model, tokenizer, r)[0]).item() for r in RESPONSES]
    assert scores == pytest.approx(expected, abs=1e-5)
    assert len({round(s, 4) for s in scores}) > 1  # the scores differ, so the comparison can fail

    # Batching does not change a score (the batch of 4 pads the short answers; one at a time pads
    # nothing), and the reward pads on its own terms whatever the tokenizer's padding side.
    one_by_one = ClassifierReward(model, tokenizer, batch_size=1).score_group(PROBLEM, group)
    assert one_by_one == pytest.approx(scores, abs=1e-5)
    for side in ("left", "right"):
        tokenizer.padding_side = side
        assert ClassifierReward(model, tokenizer, batch_size=4).score_group(PROBLEM, group) == \
            pytest.approx(scores, abs=1e-5)
    raw = ClassifierReward(model, tokenizer, normalize="none").score_group(PROBLEM, group)
    assert raw == pytest.approx([hand_logits(model, tokenizer, r)[0].item() for r in RESPONSES], abs=1e-5)


def test_classifier_two_labels(tiny_model_dir: Path) -> None:
    model, tokenizer = tiny_classifier(tiny_model_dir, num_labels=2)
    group = [completion(r) for r in RESPONSES]
    logits = [hand_logits(model, tokenizer, r) for r in RESPONSES]
    softmax = ClassifierReward(model, tokenizer, label=1, normalize="softmax", batch_size=3).score_group(PROBLEM, group)
    # softmax(z)[1] = 1 / (1 + exp(z0 - z1))
    assert softmax == pytest.approx([1 / (1 + torch.exp(z[0] - z[1])).item() for z in logits], abs=1e-5)
    sigmoid = ClassifierReward(model, tokenizer, label=0).score_group(PROBLEM, group)
    assert sigmoid == pytest.approx([torch.sigmoid(z[0]).item() for z in logits], abs=1e-5)
    with pytest.raises(ValueError, match="2 labels; set label"):
        ClassifierReward(model, tokenizer)
    with pytest.raises(ValueError, match="label 2 is not one"):
        ClassifierReward(model, tokenizer, label=2)


def test_classifier_from_pretrained(tiny_model_dir: Path, tmp_path: Path) -> None:
    model, tokenizer = tiny_classifier(tiny_model_dir, num_labels=1)
    model.config.pad_token_id = None
    with pytest.raises(ValueError, match="pad_token_id is None"):
        ClassifierReward(model, tokenizer)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model.config.pad_token_id = tokenizer.pad_token_id
    group = [completion(r) for r in RESPONSES]
    loaded = ClassifierReward.from_pretrained(str(tmp_path))
    assert loaded.pad_id == tokenizer.pad_token_id  # filled in from the tokenizer
    assert loaded.score_group(PROBLEM, group) == pytest.approx(
        ClassifierReward(model, tokenizer).score_group(PROBLEM, group), abs=1e-5)


def test_classifier_without_chat_template(tiny_model_dir: Path) -> None:
    model, tokenizer = tiny_classifier(tiny_model_dir, num_labels=1)
    tokenizer.chat_template = None
    reward = ClassifierReward(model, tokenizer)
    assert reward.input_ids(PROBLEM, "5") == tokenizer(PROBLEM.prompt, "5")["input_ids"]
    assert len(reward.score_group(PROBLEM, [completion("5"), completion("six")])) == 2
    with pytest.raises(TypeError, match="no chat template"):
        reward.score_group(Problem("c", [{"role": "user", "content": "hi"}], "x"), [completion("5")])



def test_the_judge_reads_the_question_not_the_system_message() -> None:
    from reasonrl.rewards.judge import question_text

    system = {"role": "system", "content": "You are SmolLM. Put the answer in \\boxed{}."}
    user = {"role": "user", "content": "What is 2 + 3?"}
    assert question_text(Problem(id="t", prompt="What is 2 + 3?", answer="5")) == "What is 2 + 3?"
    assert question_text(Problem(id="c", prompt=[system, user], answer="5")) == "What is 2 + 3?"
    few_shot = [system, {"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "2"}, user]
    assert question_text(Problem(id="f", prompt=few_shot, answer="5")) == (
        "user: 1 + 1?\n\nassistant: 2\n\nuser: What is 2 + 3?")
