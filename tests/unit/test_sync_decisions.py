"""The weight-sync check's decision on scripted probes (a fake engine and learner): an engine
output that did not move while the learner's log-probs did is a failed sync; one that did not move
while the learner did not either is not; a gap above the threshold is a failed sync; each error
names the backend and the cause. (On real engines: tests/integration/test_sync_check.py.)"""

from __future__ import annotations

import pytest
import torch

from reasonrl.guards.sync_check import SyncCheck, SyncCheckError, describe_backend
from reasonrl.types import Completion, Group, Problem, SamplingParams

PROBLEMS = [Problem(id=str(i), prompt=f"p{i}", answer="") for i in range(2)]


class Engine:
    def __init__(self):
        self.tokens, self.logp = [(5, 6), (7, 8)], [(-1.0, -2.0), (-0.5, -0.25)]

    def generate(self, problems, sampling):
        return [Group(problem=p, prompt_ids=(1, 2, 3), completions=(Completion(tokens, "", logp, "length"),))
                for p, tokens, logp in zip(problems, self.tokens, self.logp)]


class Learner:
    """Log-probs = the engine's + `shift` at every completion token."""

    model = None

    def __init__(self, engine: Engine):
        self.engine, self.shift = engine, 0.0
        self.reference: list = []

    def logprobs(self, model, batch, micro_batch_size):
        out = torch.zeros_like(batch.loss_mask_NT)
        for i, logp in enumerate(self.reference):
            out[i][batch.loss_mask_NT[i].bool()] = torch.tensor(logp) + self.shift
        return out


def checked(max_gap=1e-3):
    engine = Engine()
    learner = Learner(engine)
    learner.reference = list(engine.logp)
    check = SyncCheck(engine, learner, PROBLEMS, SamplingParams(max_new_tokens=2),
                      backend=describe_backend(lora=True), max_gap=max_gap)
    check.after_sync(0)  # before the first update: the baseline
    return engine, learner, check


def synced(check: SyncCheck) -> dict[str, float]:
    """The check after step 1's sync, and what it reports for that step."""
    check.after_sync(1)
    return check.metrics(0, None)


def test_an_engine_that_moved_with_the_learner_passes():
    engine, learner, check = checked()
    engine.logp = learner.reference = [(-0.9, -2.1), (-0.6, -0.2)]
    metrics = synced(check)
    assert metrics["sync/changed"] == 1.0 and metrics["sync/logp_gap"] < 1e-6  # float32 rounding of the learner
    assert metrics["perf/sync_check_s"] >= 0


def test_nothing_moved_because_nothing_was_trained_passes():
    _, _, check = checked()
    assert synced(check)["sync/changed"] == 0.0
    assert check.metrics(1, None) == {}  # reported once, for the step whose sync it checked


def test_an_engine_that_kept_its_output_while_the_learner_moved_fails():
    _, learner, check = checked(max_gap=1.0)
    learner.shift = 0.3  # the learner's log-probs moved; the engine's did not
    with pytest.raises(SyncCheckError, match=r"after step 1 \(backend: local hf engine, LoRA adapters, float32\): "
                                             r"the engine's outputs on 2 of 2 probe sequences .* moved by 0.3 nats.*"
                                             r"the adapters were not copied"):
        check.after_sync(1)


def test_a_partly_moved_engine_fails_on_the_gap():
    engine, learner, check = checked()
    engine.logp = [(-0.9, -2.1), (-0.6, -0.2)]
    learner.reference = [(-0.9, -2.1), (-0.6, -0.2)]
    learner.shift = 0.01  # the engine moved, but not to the learner's weights
    with pytest.raises(SyncCheckError, match=r"differ from the learner's by 0.01 nats per token.*sync_max_gap=0.001.*"
                                             r"skipped some adapter modules"):
        check.after_sync(1)
    _, learner, check = checked()  # a gap from the very start (e.g. another model) shows before the first update
    learner.shift, check.previous = 0.5, None
    with pytest.raises(SyncCheckError, match="before the first update"):
        check.after_sync(0)
