"""`reasonrl eval` end to end on a tiny model: results files, metrics in range and consistent with
each other, cached completions reused, bad input named."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from reasonrl.commands.cli import main
from reasonrl.commands.eval import eval_problems
from reasonrl.eval.metrics import pass_at_k
from reasonrl.rewards import MathReward
from reasonrl.rewards.judge import ClassifierReward


@pytest.fixture(autouse=True)
def checker_that_the_tiny_model_can_satisfy(monkeypatch):
    """The tiny random model never writes a right sum, so math-verify would make every metric 0 and
    every comparison below 0 == 0. Here a completion counts as right when its text has an odd number of
    characters: a verdict the model meets on some samples and not others."""
    monkeypatch.setattr(MathReward, "__call__", lambda self, completion, problem: float(len(completion) % 2 == 1))


def run_eval(model_dir, out, *extra):
    return main(["eval", str(model_dir), "--task", "arithmetic", "--n", "4", "--k", "1,2,4", "--limit", "6",
                 "--max-new-tokens", "8", "--out", str(out), "--no-progress", *extra])


def test_eval_writes_results_and_resumes_from_the_cache(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "eval"
    assert run_eval(tiny_model_dir, out, "--tts", "majority,pass", "--budget", "1,4") == 0
    results = json.loads((out / "results.json").read_text())
    metrics = results["tasks"]["arithmetic"]
    assert metrics["problems"] == 6 and metrics["length_mean"] <= 8
    for k in (1, 2, 4):
        for name in (f"pass@{k}", f"maj@{k}", f"mean@{k}"):
            low, high = metrics[name]["ci95"]
            assert 0 <= low <= metrics[name]["value"] <= high <= 1
    assert metrics["pass@1"]["value"] == pytest.approx(metrics["mean@1"]["value"])
    assert 0 < metrics["pass@1"]["value"] < metrics["pass@4"]["value"] < 1  # the checker's verdicts vary
    assert metrics["pass@1"]["value"] <= metrics["pass@2"]["value"] <= metrics["pass@4"]["value"]
    assert [row["budget"] for row in metrics["tts"]["pass"]] == [1.0, 4.0]
    assert metrics["tts"]["pass"][1]["accuracy"] == pytest.approx(metrics["pass@4"]["value"])
    assert "| arithmetic | 6 |" in (out / "results.md").read_text()
    cached = (out / "completions.jsonl").read_text()
    assert len(cached.splitlines()) == 6

    # A second run with other k: nothing is generated again, the shared numbers are the same.
    assert run_eval(tiny_model_dir, out, "--k", "1") == 0
    assert (out / "completions.jsonl").read_text() == cached
    again = json.loads((out / "results.json").read_text())["tasks"]["arithmetic"]
    assert again["pass@1"] == metrics["pass@1"]


def test_pass_at_k_is_recomputable_from_the_cached_samples(tiny_model_dir, tmp_path):
    out = tmp_path / "eval"
    assert run_eval(tiny_model_dir, out) == 0
    metrics = json.loads((out / "results.json").read_text())["tasks"]["arithmetic"]
    problems = {p.id: p for p in eval_problems("arithmetic", 6)}
    check = MathReward()
    per_problem = []
    for line in (out / "completions.jsonl").read_text().splitlines():
        record = json.loads(line)
        correct = sum(check(c["text"], problems[record["problem_id"]]) for c in record["completions"])
        per_problem.append(pass_at_k(4, int(correct), 2))
    assert 0 < metrics["pass@2"]["value"] < 1
    assert metrics["pass@2"]["value"] == pytest.approx(sum(per_problem) / len(per_problem))


@pytest.mark.parametrize(("extra", "message"), [
    (("--k", "8"), "between 1 and n=4"),
    (("--tts", "beams"), "unknown test-time scaling"),
    (("--tts", "beam", "--budget", "2"), "need --prm PATH"),
    (("--tts", "best_of_n", "--scorer", "nope"), "neither logprob, verifier, prm nor a reward model"),
    (("--tts", "beam", "--budget", "2", "--prm", "/nonexistent"), "not a model directory"),
])
def test_bad_arguments_are_named(tiny_model_dir, tmp_path, capsys, extra, message):
    assert run_eval(tiny_model_dir, tmp_path / "eval", *extra) == 2
    assert message in capsys.readouterr().err


def test_a_training_checkpoint_is_a_model_and_an_empty_directory_says_what_a_model_holds(tiny_model_dir, tmp_path,
                                                                                           capsys):
    import shutil

    checkpoint = tmp_path / "run" / "checkpoints" / "step_000002"
    shutil.copytree(tiny_model_dir, checkpoint / "policy")
    (checkpoint / "trainer_state.pt").write_bytes(b"")
    assert main(["eval", str(checkpoint), "--task", "arithmetic", "--n", "1", "--limit", "1", "--max-new-tokens", "2",
                 "--out", str(tmp_path / "eval"), "--no-progress"]) == 0
    capsys.readouterr()
    (tmp_path / "empty").mkdir()
    for directory, named in ((tmp_path / "empty", "holds nothing"), (tmp_path / "run", "pass one of its checkpoints")):
        assert main(["eval", str(directory), "--task", "arithmetic", "--out", str(tmp_path / "eval2")]) == 2
        err = capsys.readouterr().err
        assert "is not a model directory (config.json and weights missing" in err and named in err
        assert "config.json, the weights (*.safetensors or pytorch_model.bin) and the tokenizer files" in err


def test_unknown_task_is_named(tiny_model_dir, tmp_path, capsys):
    assert main(["eval", str(tiny_model_dir), "--task", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown eval task 'nope'" in capsys.readouterr().err


@pytest.fixture(scope="module")
def prm_dir(tmp_path_factory):
    from helpers import build_tiny_model

    # Larger initial weights than the policy, so the PRM's P("+") moves away from 1/2 and ranks beams.
    return build_tiny_model(tmp_path_factory.mktemp("tiny-prm"), seed=3, initializer_range=0.5)


def test_beam_search_end_to_end_and_its_answers_recomputable(tiny_model_dir, prm_dir, tmp_path):
    from reasonrl.rewards.prm import ModelPRM
    from reasonrl.types import Problem

    out = tmp_path / "eval"
    extra = ("--tts", "beam,beam_majority", "--prm", str(prm_dir), "--budget", "1,2,4", "--beam-width", "2",
             "--max-step-tokens", "3", "--step-delimiter", "\\n")
    assert run_eval(tiny_model_dir, out, *extra, "--limit", "3") == 0
    results = json.loads((out / "results.json").read_text())
    metrics = results["tasks"]["arithmetic"]
    assert results["settings"]["step_delimiter"] == "\n"
    for method in ("beam", "beam_majority"):
        rows = metrics["tts"][method]
        assert [row["budget"] for row in rows] == [1.0, 2.0, 4.0]
        for row in rows:
            assert 0.0 <= row["accuracy"] <= 1.0
            # Every round samples N steps per problem; no solution is longer than --max-new-tokens 8.
            assert row["step_samples"] == pytest.approx(row["budget"] * row["rounds"])
            assert 0 < row["tokens"] <= row["step_samples"] * 3
    records = [json.loads(line) for line in (out / "beams.jsonl").read_text().splitlines()]
    assert len(records) == 3 * 3  # problems x budgets
    prm = ModelPRM.from_pretrained(str(prm_dir))
    problems = {p.id: p for p in eval_problems("arithmetic", 3)}
    check = MathReward()
    # The records of N = 4 (the last budget searched): the answer "beam" takes is the best solution's.
    widest = [r for r in records if r["search"] == records[-1]["search"]]
    assert len(widest) == 3
    credits = []
    for record in widest:
        solutions = record["solutions"]
        assert 1 <= len(solutions) <= 4 and all(len(s["token_ids"]) <= 8 for s in solutions)
        problem: Problem = problems[record["problem_id"]]
        best = solutions[0]
        assert best["score"] == max(s["score"] for s in solutions)
        # The stored score is the PRM's score of the last non-blank step ("last" aggregation).
        steps = [s.strip() for s in best["steps"] if s.strip()]
        if steps:
            [scores] = prm.score_steps(problem, [steps])
            assert best["score"] == pytest.approx(scores[-1], abs=1e-5)
        credits.append(check(best["text"], problem))
    assert metrics["tts"]["beam"][2]["accuracy"] == pytest.approx(sum(credits) / 3)

    # A second run reads every search from the cache.
    cached = (out / "beams.jsonl").read_text()
    assert run_eval(tiny_model_dir, out, *extra, "--limit", "3") == 0
    assert (out / "beams.jsonl").read_text() == cached
    assert json.loads((out / "results.json").read_text())["tasks"]["arithmetic"]["tts"] == metrics["tts"]


def test_best_of_n_by_a_reward_model_and_by_the_verifier(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id)
    rm_dir = tmp_path / "rm"
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(rm_dir)
    tokenizer.save_pretrained(rm_dir)
    out = tmp_path / "eval"
    assert run_eval(tiny_model_dir, out, "--tts", "best_of_n", "--budget", "1,4", "--scorer", str(rm_dir)) == 0
    by_rm = json.loads((out / "results.json").read_text())["tasks"]["arithmetic"]
    assert by_rm["tts"]["best_of_n"][0]["accuracy"] == pytest.approx(by_rm["mean@1"]["value"])  # b=1: one sample
    # b=4 is the whole group: each problem scores its reward model's top sample (ties share the credit).
    reward_model = ClassifierReward.from_pretrained(str(rm_dir))
    problems = {p.id: p for p in eval_problems("arithmetic", 6)}  # the prompts eval made
    credits = []
    for line in (out / "completions.jsonl").read_text().splitlines():
        record = json.loads(line)
        texts = [c["text"] for c in record["completions"]]
        scores = reward_model.score_group(problems[record["problem_id"]], [SimpleNamespace(text=t) for t in texts])
        top = [t for t, s in zip(texts, scores, strict=True) if s == pytest.approx(max(scores), abs=1e-12)]
        credits.append(sum(len(t) % 2 for t in top) / len(top))
    assert len(credits) == 6
    assert by_rm["tts"]["best_of_n"][1]["accuracy"] == pytest.approx(sum(credits) / 6)
    # The verifier checks against the gold answer: best-of-4 by it is pass@4 (same cached samples).
    assert run_eval(tiny_model_dir, out, "--tts", "best_of_n", "--budget", "1,4", "--scorer", "verifier") == 0
    by_verifier = json.loads((out / "results.json").read_text())["tasks"]["arithmetic"]
    assert by_verifier["tts"]["best_of_n"][1]["accuracy"] == pytest.approx(by_verifier["pass@4"]["value"])
    assert by_verifier["problems"] == 6


@pytest.mark.parametrize("task", ["arithmetic", "gsm8k"])
def test_eval_makes_the_prompts_as_the_config_trains_them(task, tiny_model_dir, tmp_path):
    from reasonrl.models import load_tokenizer

    def prompts(out, *extra):
        assert main(["eval", str(tiny_model_dir), "--task", task, "--n", "1", "--limit", "2", "--max-new-tokens", "1",
                     "--out", str(out), "--no-progress", *extra]) == 0
        tokenizer = load_tokenizer(str(tiny_model_dir))
        return [tokenizer.decode(json.loads(line)["prompt_ids"])
                for line in (out / "completions.jsonl").read_text().splitlines()]

    # The tiny model's tokenizer knows ASCII only (GSM8K's first question has a curly apostrophe).
    questions = [p.prompt.encode("ascii", "ignore").decode() for p in eval_problems(task, 2, "{prompt}")]
    trained = prompts(tmp_path / "config", "--config", "grpo", "--set", "task.prompt_template=Q: {prompt} (show work)")
    assert all(f"Q: {q} (show work)" in text for q, text in zip(questions, trained, strict=True))
    plain = prompts(tmp_path / "plain")
    assert not any("(show work)" in text for text in plain)
