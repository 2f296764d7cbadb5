"""benchmarks/runs.py: a default of `reasonrl train` that changed is a changed setting for the records.
A run on the defaults recorded before the change stands for a run that pins the old value (so a
study that pins it keeps its records, and its new seeds run as the old ones did), and not for a run
on the new default, which runs afresh instead of taking a record made under the old one."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import pytest
from benchmarks import runs

from reasonrl.recipes import recipes

KEY = "sampling.mask_truncated"
OLD, NEW = "abc1234", "def5678"  # a record's commit before the change, and one after


@pytest.fixture
def history(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs, "CHANGED_DEFAULTS", (runs.ChangedDefault(KEY, "false", "true", "c0ffee0"),))
    monkeypatch.setattr(runs, "predates", lambda commit, change: commit.startswith(OLD) and change == "c0ffee0")


def record(commit: str, args: list[str], config: str | None = None) -> dict:
    return {"config": config, "args": args, "commit": commit}


def test_an_old_record_on_the_defaults_stands_for_the_old_value_pinned_not_for_the_new_default(history: None) -> None:
    old = record(OLD, ["train.lr=1e-5", "run.seed=3"])
    assert runs.same_run(old, None, [f"{KEY}=false", "train.lr=1e-5", "run.seed=3"])
    assert not runs.same_run(old, None, ["train.lr=1e-5", "run.seed=3"])
    assert not runs.same_run(old, None, [f"{KEY}=false", "train.lr=2e-5", "run.seed=3"])


def test_a_record_made_after_the_change_stands_for_the_new_default(history: None) -> None:
    new = record(NEW, ["run.seed=3"])
    assert runs.same_run(new, None, ["run.seed=3"]) and runs.same_run(new, None, [f"{KEY}=true", "run.seed=3"])
    assert not runs.same_run(new, None, [f"{KEY}=false", "run.seed=3"])


def test_the_last_setting_of_the_key_is_the_one_that_counts(history: None) -> None:
    # A study pins the old value first and one of its arms sets the key itself (the last override wins).
    arm = record(OLD, [f"{KEY}=true", "run.seed=3"])
    assert runs.same_run(arm, None, [f"{KEY}=false", f"{KEY}=true", "run.seed=3"])
    assert not runs.same_run(arm, None, [f"{KEY}=false", "run.seed=3"])


def test_an_evaluation_alone_is_the_same_under_either_value(history: None) -> None:
    assert runs.same_run(record(OLD, ["eval.samples=8", "train.steps=0"]), None, ["eval.samples=8", "train.steps=0"])


def test_a_recipe_files_runs_compare_their_arguments_as_they_are(history: None) -> None:
    assert runs.same_run(record(OLD, ["run.seed=1"], "grpo"), "grpo", ["run.seed=1"])
    assert not runs.same_run(record(OLD, ["run.seed=1"], "grpo"), "grpo", [f"{KEY}=false", "run.seed=1"])
    assert not runs.same_run(record(OLD, ["run.seed=1"], "grpo"), None, ["run.seed=1"])


def test_every_recipe_file_pins_every_changed_key() -> None:
    # Why a recipe's runs need no translation: its file fixes the value whatever the default.
    for recipe in recipes():
        values = tomllib.loads(recipe.path.read_text())
        for changed in runs.CHANGED_DEFAULTS:
            section, key = changed.key.split(".")
            assert key in values.get(section, {}), f"{recipe.name} does not pin {changed.key}"


def test_train_run_reuses_an_old_record_for_a_pinned_run_and_reruns_it_on_the_new_default(
        history: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(runs, "RESULTS", tmp_path)
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "run0.json").write_text(json.dumps({**record(OLD, ["run.seed=0"]), "marker": "old"}))
    ran: list[list[str]] = []

    def fake_train(command: list[str], **_: object) -> None:
        ran.append(command)
        run_dir = Path(next(arg for arg in command if arg.startswith("run.dir=")).removeprefix("run.dir="))
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text('{"step": 1, "perf/step_s": 1.0}\n')

    monkeypatch.setattr(runs, "run_command", fake_train)
    monkeypatch.setattr(runs, "code_version", lambda: NEW)
    assert runs.train_run("study", "run0", None, [f"{KEY}=false", "run.seed=0"])["marker"] == "old" and not ran
    fresh = runs.train_run("study", "run0", None, ["run.seed=0"])
    assert len(ran) == 1 and "marker" not in fresh and fresh["commit"] == NEW


@pytest.mark.parametrize(("describe", "commit"), [("f261190", "f261190"), ("f261190-dirty", "f261190"),
                                                  ("v1.0-3-gf261190-dirty", "f261190"), ("unknown", None)])
def test_the_commit_of_a_code_version(describe: str, commit: str | None) -> None:
    assert runs.git_commit(describe) == commit


def test_which_records_predate_the_switch_of_mask_truncated_in_this_history() -> None:
    def short(name: str) -> str | None:
        done = subprocess.run(["git", "-C", str(Path(runs.__file__).parent), "rev-parse", "--short=7", name],
                              capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else None

    change = runs.CHANGED_DEFAULTS[0].commit
    parent, grandparent = short(f"{change}^"), short(f"{change}^^")
    if parent is None or grandparent is None:
        pytest.skip("a checkout without the history of the change (a shallow or exported copy)")
    assert runs.predates(parent, change) and runs.predates(f"{grandparent}-dirty", change)
    assert not runs.predates(change, change) and not runs.predates(f"{parent}-dirty", change)
    assert not runs.predates("unknown", change) and not runs.predates("0000000", change)
    assert not runs.predates(short("HEAD") or "unknown", change)
