"""`reasonrl eval` end to end on a tiny model: results files, metrics in range and consistent with
each other, cached completions reused, bad input named."""

from __future__ import annotations

import json

import pytest

from reasonrl.cli import main
from reasonrl.eval.command import eval_problems
from reasonrl.eval.metrics import pass_at_k
from reasonrl.rewards import MathReward


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
    assert metrics["pass@2"]["value"] == pytest.approx(sum(per_problem) / len(per_problem))


@pytest.mark.parametrize(("extra", "message"), [
    (("--k", "8"), "between 1 and n=4"),
    (("--tts", "beam"), "unknown test-time scaling"),
])
def test_bad_arguments_are_named(tiny_model_dir, tmp_path, capsys, extra, message):
    assert run_eval(tiny_model_dir, tmp_path / "eval", *extra) == 2
    assert message in capsys.readouterr().err


def test_unknown_task_is_named(tiny_model_dir, tmp_path, capsys):
    assert main(["eval", str(tiny_model_dir), "--task", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown eval task 'nope'" in capsys.readouterr().err
