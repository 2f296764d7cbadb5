"""A participant of the user's (`train(cfg, participants=[...])`, docs/callbacks.md) takes part in every
hook the loop calls, after the run's own, with the step numbers the docs give; what its hooks add to
the metrics is logged; its reason to stop ends the run after that step with a checkpoint, which holds
its state for a resumed run; one without the hooks, or keeping its state under a name the run uses,
is refused. examples/callback.py's early stopping stops a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import TASK, share_of_a, tiny_config

from reasonrl import Participant, train
from reasonrl.registry import import_object
from reasonrl.trainer import build_run
from reasonrl.training.checkpoint import checkpoints
from reasonrl.training.runs import start_run

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "callback.py"


class Recorder(Participant):
    """Records each hook's call and its step; stops after `stop_after` steps (0: never)."""

    name = "recorder"

    def __init__(self, stop_after: int = 0):
        self.calls: list[tuple] = []
        self.stop_after = stop_after
        self.loaded: dict | None = None

    def observe(self, step, indices, groups):
        self.calls.append(("observe", step))
        return groups

    def contribute(self, step, update):
        self.calls.append(("contribute", step))
        return update

    def after_update(self, step, batch, metrics):
        self.calls.append(("after_update", step))
        metrics["user/saw_policy_loss"] = float("loss/policy" in metrics)  # the update's own metrics come first

    def after_sync(self, step):
        self.calls.append(("after_sync", step))

    def metrics(self, step, rollouts):
        self.calls.append(("metrics", step))
        return {"user/step": float(step), "user/groups": float(len(rollouts.groups))}

    def stop_reason(self, step):
        self.calls.append(("stop_reason", step))
        return "the test has seen enough" if step == self.stop_after else ""

    def state_dict(self):
        self.calls.append(("state_dict",))
        return {"calls": len(self.calls)}

    def load_state_dict(self, state):
        self.loaded = state


def step_lines(run_dir: Path) -> list[dict]:
    return [m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss/policy" in m]


def step_calls(step: int) -> list[tuple]:
    """The hooks of step `step` (0-based: the steps done before it), in the order the loop calls them."""
    return [("observe", step), ("contribute", step), ("after_update", step), ("after_sync", step + 1),
            ("metrics", step), ("stop_reason", step + 1)]


def test_a_users_participant_is_called_at_every_hook_in_order_and_its_metrics_are_logged(tiny_model_dir, tmp_path):
    recorder = Recorder()
    result = train(tiny_config(tiny_model_dir, tmp_path, "train.steps=2"), task=TASK, reward=share_of_a,
                   participants=[recorder])
    assert result.steps == 2
    # The engine holds the start's weights before the first step; the final checkpoint takes the state.
    assert recorder.calls == [("after_sync", 0), *step_calls(0), *step_calls(1), ("state_dict",)]
    logged = step_lines(tmp_path)
    assert [m["step"] for m in logged] == [1, 2]  # a step's metrics are logged under its number from 1
    assert [m["user/step"] for m in logged] == [0.0, 1.0]
    assert all(m["user/groups"] == 4.0 and m["user/saw_policy_loss"] == 1.0 for m in logged)


def test_a_users_participants_come_after_the_runs_own(tiny_model_dir, tmp_path):
    first, second = Recorder(), Recorder()
    second.name = "second"
    run = build_run(start_run(tiny_config(tiny_model_dir, tmp_path)), TASK, share_of_a, [first, second])
    assert [type(part).__name__ for part in run.participants.parts] == [
        "ProblemSampler", "KLController", "GeneratedTokens", "SyncCheck", "Alarms", "Recorder", "Recorder"]
    assert run.participants.parts[-2:] == (first, second)
    assert run.producer.observer.parts[-2:] == (first, second)  # production's observers too
    assert list(run.stateful)[-2:] == ["recorder", "second"]


def test_a_reason_to_stop_ends_the_run_with_a_checkpoint_that_keeps_the_participants_state(tiny_model_dir,
                                                                                           tmp_path):
    stopping = Recorder(stop_after=1)
    result = train(tiny_config(tiny_model_dir, tmp_path, "train.steps=3"), task=TASK, reward=share_of_a,
                   participants=[stopping])
    assert result.steps == 1 and [m["step"] for m in step_lines(tmp_path)] == [1]
    assert [path.name for path in checkpoints(tmp_path)] == ["step_000001"]
    assert stopping.calls[-2:] == [("stop_reason", 1), ("state_dict",)]
    saved = {"calls": len(stopping.calls)}  # as counted when state_dict was called

    resumed = Recorder()
    result = train(tiny_config(tiny_model_dir, tmp_path, "train.steps=3", "run.resume=true"), task=TASK,
                   reward=share_of_a, participants=[resumed])
    assert result.steps == 3 and resumed.loaded == saved
    assert resumed.calls[0] == ("after_sync", 1)  # the resumed run starts from the weights after step 1
    assert resumed.calls[1:13] == [*step_calls(1), *step_calls(2)]


class NoHooks:
    name = ""


def test_a_participant_without_the_hooks_or_with_a_taken_name_is_refused(tiny_model_dir, tmp_path):
    with pytest.raises(TypeError, match=r"has no observe, contribute, .*subclass reasonrl.Participant"):
        train(tiny_config(tiny_model_dir, tmp_path / "a"), task=TASK, reward=share_of_a, participants=[NoHooks()])
    assert not (tmp_path / "a").exists()  # refused before the run starts
    taken = Recorder()
    taken.name = "sampler"
    with pytest.raises(ValueError, match=r"under the name 'sampler'"):
        train(tiny_config(tiny_model_dir, tmp_path / "b"), task=TASK, reward=share_of_a, participants=[taken])
    twins = [Recorder(), Recorder()]
    with pytest.raises(ValueError, match=r"under the name 'recorder'"):
        train(tiny_config(tiny_model_dir, tmp_path / "c"), task=TASK, reward=share_of_a, participants=twins)


def test_the_examples_early_stopping_ends_a_run_without_gain(tiny_model_dir, tmp_path):
    early_stopping = import_object(f"{EXAMPLE}:EarlyStopping")
    best = tmp_path / "best.jsonl"
    # A gain above 1 is impossible: the first step sets the best, the second has none, and the run stops.
    stopper = early_stopping(patience=1, min_gain=1.0, best_path=str(best))
    result = train(tiny_config(tiny_model_dir, tmp_path / "run", "train.steps=4"), task=TASK, reward=share_of_a,
                   participants=[stopper])
    assert result.steps == 2
    logged = step_lines(tmp_path / "run")
    assert [m["callback/steps_without_gain"] for m in logged] == [0.0, 1.0]
    first_accuracy = logged[0]["callback/best_accuracy"]
    assert logged[1]["callback/best_accuracy"] == first_accuracy and 0.0 <= first_accuracy <= 1.0
    written = best.read_text().splitlines() if best.exists() else []
    assert len(written) == (first_accuracy > 0)  # the best step's first correct completion, when it had one
    assert stopper.state_dict() == {"best": first_accuracy, "waited": 1}
