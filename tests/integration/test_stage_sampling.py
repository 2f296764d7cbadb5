"""`train`, online `dpo` and `rft` sample with the settings `build.build_sampling` makes of the
rollout.* knobs: top_k, top_p, temperature, stop strings and lengths reach the engine the same way
in all three (sft samples nothing)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reasonrl import Problem, Task, load_config
from reasonrl.build import build_sampling
from reasonrl.rollout.hf import HFEngine
from reasonrl.stages.preference import train_dpo
from reasonrl.stages.rft import train_rft
from reasonrl.trainer import train

TASK = Task(name="letters", train=[Problem(id=str(i), prompt=f"say {i}", answer="a") for i in range(4)],
            test=[Problem(id="t", prompt="say t", answer="a")])
ROLLOUT = ["rollout.top_k=3", "rollout.top_p=0.9", "rollout.temperature=0.8", "rollout.max_new_tokens=3",
           'rollout.stop=["zz"]', "rollout.group_size=2"]


def share_of_a(text: str, problem: Problem) -> float:
    return text.count("a") / len(text) if text else 0.0


@pytest.mark.parametrize("command", ["train", "dpo", "rft"])
def test_every_sampling_command_uses_the_rollout_knobs(command, tiny_model_dir, tmp_path, monkeypatch):
    seen = []
    generate = HFEngine.generate

    def spy(self, problems, sampling):
        seen.append(sampling)
        return generate(self, problems, sampling)

    monkeypatch.setattr(HFEngine, "generate", spy)
    cfg = load_config(overrides=[
        f"model.name={tiny_model_dir}", f"run.dir={tmp_path / 'run'}", "run.progress=false", "run.tensorboard=false",
        # The weight-sync check's probe samples with its own settings (tests/integration/test_sync_check.py).
        "run.save_every=0", "run.sync_check=false", "train.steps=1", "eval.problems=0", "rollout.prompts_per_step=2", "dpo.online=true",
        "dpo.pairs_per_step=2", "rft.problems_per_round=2", "rft.steps_per_round=1", "sft.batch_size=2", *ROLLOUT])
    {"train": train, "dpo": train_dpo, "rft": train_rft}[command](cfg, task=TASK, reward=share_of_a)

    assert seen, f"{command} generated nothing"
    expected = build_sampling(cfg)
    assert (expected.top_k, expected.top_p, expected.stop) == (3, 0.9, ("zz",))
    for sampling in seen:
        assert replace(sampling, seed=None) == replace(expected, seed=None)
