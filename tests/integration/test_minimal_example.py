"""examples/minimal_grpo.py is the loop `reasonrl train` runs by default: at the same settings and
seed, the two log the same metrics at every step, bit for bit.

Both run in this process on a tiny random model (the same CPU threads: a float sum's order, and so
its rounding, may depend on how many threads share it). Equality is exact, not to a tolerance:
the script calls the same functions on the same tensors in the same order with the same seeds,
so any difference is a step done differently (a missed weight sync, another loss normaliser,
advantages, sampling seed or problem order), however small its effect. `reasonrl train` runs
with what the script leaves out turned off (evaluation, checkpoints, TensorBoard, the sync
check, the alarms), none of which changes what is sampled or trained.

A random model never writes the answer to a sum, so every reward would be 0 and no update would
move the weights. The math and format checks are replaced, in both runs alike, by checks it
passes about half the time: the weighting, the gate of the format bonus on correctness and
everything after them are the real ones.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from reasonrl import load_config, train
from reasonrl.rewards import FormatReward, MathReward

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "minimal_grpo.py"
STEPS = 3
# What the script logs that must be in the comparison (it compares every key the two share).
ESSENTIAL = {"reward/mean", "reward/std", "reward/correct", "reward/format", "rollout/len_mean",
             "rollout/truncated_frac", "loss/policy", "loss/clip_frac", "loss/ratio_mean", "entropy/mean",
             "rollout/logp_gap", "train/grad_norm", "train/lr"}


def holds_a_digit(self, completion: str, problem) -> float:
    return float(any(c.isdigit() for c in completion))


def holds_a_vowel(self, completion: str, problem) -> float:
    return float(any(c in "aeiou" for c in completion))


def load_example():
    spec = importlib.util.spec_from_file_location("minimal_grpo", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("dtype", ["float32", "auto"])
def test_the_minimal_example_logs_what_reasonrl_train_logs(tiny_model_dir, tmp_path, monkeypatch, capsys, dtype,
                                                           request):
    monkeypatch.setattr(MathReward, "__call__", holds_a_digit)
    monkeypatch.setattr(FormatReward, "__call__", holds_a_vowel)
    settings = {"seed": 3, "steps": STEPS, "prompts_per_step": 3, "group_size": 4, "max_new_tokens": 8, "lr": 1e-2}

    # One thread for both: with other runs on the machine, reasonrl train would take a share of the
    # cores (training/cpu_share.py) while the example keeps torch's count, and float32 sums would differ.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    example = load_example().main([f"--model={tiny_model_dir}", f"--dtype={dtype}",
                                   *(f"--{key.replace('_', '-')}={value}" for key, value in settings.items())])
    printed = capsys.readouterr().out.splitlines()

    run_dir = tmp_path / "run"
    train(load_config(overrides=[
        f"model.name={tiny_model_dir}", f"run.dir={run_dir}", f"run.seed={settings['seed']}",
        f"train.steps={STEPS}", f"rollout.prompts_per_step={settings['prompts_per_step']}",
        f"rollout.group_size={settings['group_size']}", f"rollout.max_new_tokens={settings['max_new_tokens']}",
        f"train.lr={settings['lr']}", f"train.dtype={dtype}", f"rollout.dtype={dtype}",
        "eval.problems=0", "run.save_every=0", "run.tensorboard=false", "run.progress=false",
        "run.sync_check=false", "run.alarms=false", "run.threads=1"]))
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    assert [line.split(" | ")[0] for line in printed] == [f"step {s:>3}/{STEPS}" for s in range(1, STEPS + 1)]
    assert [m["step"] for m in logged] == list(range(1, STEPS + 1))
    assert len(example) == STEPS
    for step, (ours, theirs) in enumerate(zip(example, logged), start=1):
        assert ESSENTIAL <= ours.keys() & theirs.keys(), f"step {step}: not compared: {ESSENTIAL - ours.keys()}"
        differing = {key: (ours[key], theirs[key]) for key in ours.keys() & theirs.keys() if ours[key] != theirs[key]}
        assert not differing, f"step {step}: the example (left) and reasonrl train (right) differ: {differing}"
    # Not vacuous: the updates moved the weights, and the gated format bonus was paid.
    assert any(m["train/grad_norm"] > 0 for m in example[:-1])
    assert any(m["reward/format"] > 0 for m in example)


def test_the_minimal_example_defaults_are_the_default_jobs():
    """What the script takes from its command line defaults to `reasonrl train`'s default, and the
    settings it fixes are that job's: a changed default (train.lr went from 2e-5 to 5e-6) fails here."""
    example, default = load_example(), load_config()

    def knob(setting: str):
        section, key = setting.split(".")
        return getattr(getattr(default, section), key)

    named = {action.dest: re.search(r"\((\w+\.\w+)\)$", action.help or "") for action in example.build_parser()._actions}
    settings = {dest: match.group(1) for dest, match in named.items() if match and dest != "dtype"}
    assert {"model", "steps", "seed", "prompts_per_step", "group_size", "max_new_tokens", "lr"} <= settings.keys()
    for dest, setting in settings.items():
        assert getattr(example.parse_args([]), dest) == knob(setting), (dest, setting)
    fixed = {"PROMPT_TEMPLATE": "task.prompt_template", "TRAIN_PROBLEMS": "task.train_size",
             "TEST_PROBLEMS": "task.test_size", "TEMPERATURE": "rollout.temperature",
             "FORMAT_WEIGHT": "reward.format_weight", "ADV_EPS": "algo.adv_eps", "GRAD_CLIP": "train.grad_clip",
             "MICRO_BATCH_SIZE": "train.micro_batch_size", "MICRO_BATCH_POSITIONS": "train.micro_batch_positions"}
    for constant, setting in fixed.items():
        assert getattr(example, constant) == knob(setting), (constant, setting)
    assert example.CLIP == default.algo.clip_low == default.algo.clip_high
