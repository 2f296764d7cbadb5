"""`reasonrl eval` keeps each model's evaluation to itself: an output directory holds one model's
results and caches (another model of the same basename, or a checkpoint rewritten at the same
path, is refused there), cached completions are keyed by the model, and an unusable output (a
file, an unreadable cache line) is one line on stderr naming it and the fix."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import build_tiny_model

from reasonrl.commands.cli import main

ARGS = ("--task", "arithmetic", "--n", "2", "--limit", "3", "--max-new-tokens", "6", "--no-progress")


def cached_texts(out):
    return [[c["text"] for c in json.loads(line)["completions"]]
            for line in (out / "completions.jsonl").read_text().splitlines()]


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("reasonrl eval: "), err
    return err


@pytest.fixture(scope="module")
def two_policies(tmp_path_factory):
    """Two different models whose directories share the basename "policy", as two runs' checkpoints do."""
    root = tmp_path_factory.mktemp("runs")
    return (build_tiny_model(root / "run_a" / "policy", seed=0),
            build_tiny_model(root / "run_b" / "policy", seed=1, initializer_range=0.5))


def test_another_model_of_the_same_basename_is_refused_in_the_default_output(two_policies, tmp_path, monkeypatch,
                                                                             capsys):
    policy_a, policy_b = two_policies
    monkeypatch.chdir(tmp_path)
    assert main(["eval", str(policy_a), *ARGS]) == 0
    out = tmp_path / "eval" / "policy"  # the default --out: eval/<basename>
    texts_a, results_a = cached_texts(out), (out / "results.json").read_text()
    capsys.readouterr()

    assert main(["eval", str(policy_b), *ARGS]) == 2
    err = one_line(capsys.readouterr().err)
    assert f"eval/policy holds the evaluation of another model: {policy_a}" in err
    assert "pass --out with another directory" in err
    assert cached_texts(out) == texts_a and (out / "results.json").read_text() == results_a

    assert main(["eval", str(policy_b), *ARGS, "--out", "eval/b"]) == 0
    results_b = json.loads((tmp_path / "eval" / "b" / "results.json").read_text())
    assert results_b["model_source"]["path"] == str(policy_b.resolve())
    assert cached_texts(tmp_path / "eval" / "b") != texts_a


def test_completions_cached_for_another_model_are_not_reused(two_policies, tmp_path):
    policy_a, policy_b = two_policies
    assert main(["eval", str(policy_b), *ARGS, "--out", str(tmp_path / "b")]) == 0
    assert main(["eval", str(policy_a), *ARGS, "--out", str(tmp_path / "a")]) == 0
    # A's completions in an output that does not yet say which model it evaluates (as older versions wrote it).
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(tmp_path / "a" / "completions.jsonl", mixed / "completions.jsonl")
    assert main(["eval", str(policy_b), *ARGS, "--out", str(mixed)]) == 0
    assert cached_texts(mixed)[3:] == cached_texts(tmp_path / "b")  # B's own, generated after A's three lines
    results = [json.loads((out / "results.json").read_text())["tasks"]["arithmetic"] for out in (mixed, tmp_path / "b")]
    assert results[0] == results[1]


def test_a_checkpoint_rewritten_at_the_same_path_is_another_model(tmp_path, capsys):
    policy = build_tiny_model(tmp_path / "run" / "policy", seed=0)
    out = tmp_path / "eval"
    assert main(["eval", str(policy), *ARGS, "--out", str(out)]) == 0
    build_tiny_model(policy, seed=2)  # a rerun writes its checkpoint where the first one was
    capsys.readouterr()
    assert main(["eval", str(policy), *ARGS, "--out", str(out)]) == 2
    err = one_line(capsys.readouterr().err)
    assert f"the files of {policy.resolve()} have changed since: " in err and "model.safetensors" in err


def test_an_output_that_is_a_file_is_named(tiny_model_dir, tmp_path, capsys):
    target = tmp_path / "results.txt"
    target.write_text("notes\n")
    assert main(["eval", str(tiny_model_dir), *ARGS, "--out", str(target)]) == 2
    assert f"the output directory {target} cannot be made: {target} is a file" in one_line(capsys.readouterr().err)
    assert target.read_text() == "notes\n"


@pytest.mark.parametrize(("bad", "named"), [
    (b'\xff\xfe{"task": "arithmetic"}', "not UTF-8 text"),
    (b'{"task": "arithmetic", "problem_id"', "not a JSON record"),
    (b'{"task": "arithmetic"}', "not a cache record (it lacks problem_id, sampling, prompt_ids, completions)"),
])
def test_an_unreadable_cache_line_is_named(tiny_model_dir, tmp_path, capsys, bad, named):
    out = tmp_path / "eval"
    assert main(["eval", str(tiny_model_dir), *ARGS, "--out", str(out)]) == 0
    cache = out / "completions.jsonl"
    first, *rest = cache.read_bytes().splitlines(keepends=True)
    cache.write_bytes(first + bad + b"\n" + b"".join(rest))
    capsys.readouterr()
    assert main(["eval", str(tiny_model_dir), *ARGS, "--out", str(out)]) == 2
    err = one_line(capsys.readouterr().err)
    assert f"{cache}, line 2: {named}" in err and "delete that line" in err


def test_a_last_line_cut_short_by_a_crash_is_dropped_and_generated_again(tiny_model_dir, tmp_path):
    out = tmp_path / "eval"
    assert main(["eval", str(tiny_model_dir), *ARGS, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())["tasks"]
    cache = out / "completions.jsonl"
    data = cache.read_bytes()
    last = data.splitlines(keepends=True)[-1]
    cache.write_bytes(data[: len(data) - len(last) // 2])  # a crash while writing the last record
    assert main(["eval", str(tiny_model_dir), *ARGS, "--out", str(out)]) == 0
    lines = cache.read_text().splitlines()
    assert all(json.loads(line) for line in lines)  # each new record on a line of its own
    assert json.loads((out / "results.json").read_text())["tasks"] == results
    assert main(["eval", str(tiny_model_dir), *ARGS, "--out", str(out)]) == 0
    assert cache.read_text().splitlines() == lines  # nothing generated again
