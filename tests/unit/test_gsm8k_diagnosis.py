"""benchmarks/gsm8k_diagnosis.py: the correct counts it reads off a reward curve, the bounds on
reward spread it draws from them, and the gained and lost problems of an RL stage's evaluations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks import gsm8k_diagnosis as diagnosis


def test_correct_counts_are_the_mean_reward_times_the_completions() -> None:
    # 32 completions: 0, 1 and 2 correct; then 1 correct answer that also earned the 0.1 format bonus.
    counts, bonus_steps = diagnosis.correct_counts([0.0, 1 / 32, 2 / 32, 1.1 / 32], 32)
    assert counts == [0, 1, 2, 1]
    assert bonus_steps == 1


def test_spread_bounds_from_the_correct_counts() -> None:
    # G = 8, P = 4 (16 groups over 4 steps). Correct per step 0, 1, 5, 2: at least one group with
    # spread in each of the last three steps, at most min(k, 4) = 0 + 1 + 4 + 2 = 7 in all.
    found = diagnosis.sparsity([0, 1, 5, 2], group_size=8, prompts=4)
    assert found["correct_total"] == 8
    assert found["steps_without_a_correct_completion"] == 1
    assert found["groups_with_spread_bounds"] == [3, 7]
    assert found["zero_std_frac_bounds"] == pytest.approx([1 - 7 / 16, 1 - 3 / 16])
    assert found["samples_with_advantage_per_step_bounds"] == pytest.approx([3 * 8 / 4, 7 * 8 / 4])
    # 3 of 4 steps had spread: 1 - (1 - q)^4 = 3/4, q = 1 - (1/4)^(1/4).
    assert found["spread_chance_per_group"] == pytest.approx(1 - 0.25 ** 0.25)
    # G correct answers may all sit in one group: no lower bound then.
    assert diagnosis.sparsity([8], group_size=8, prompts=4)["groups_with_spread_bounds"] == [None, 4]


def test_the_accuracy_change_interval_has_the_sign_of_the_change() -> None:
    assert diagnosis.difference_ci([0.0] * 6, [1.0] * 6) == [1.0, 1.0]
    low, high = diagnosis.difference_ci([0.1, 0.2, 0.3, 0.2], [0.0, 0.1, 0.0, 0.1])
    assert low <= -0.15 <= high < 0


def test_an_rl_stage_gains_and_loses_problems_from_its_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from reasonrl.commands.eval import eval_problems

    problems = eval_problems("gsm8k", 3)
    gold = [problem.answer for problem in problems]
    monkeypatch.setattr(diagnosis, "RESULTS", tmp_path)

    def write(out: Path, answers: list[tuple[str, str]]) -> None:
        out.mkdir(parents=True)
        rows = [{"problem_id": problem.id, "completions": [{"text": text, "finish_reason": reason, "token_ids": [1] * 4}]}
                for problem, (text, reason) in zip(problems, answers)]
        (out / "completions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

    write(tmp_path / "gsm8k" / "arm" / "after_cold_start",
          [(f"so\n#### {gold[0]}", "stop"), ("no idea", "length"), ("\\boxed{12345678}", "stop")])
    write(tmp_path / "gsm8k" / "arm" / "after",
          [("#### 99999999", "stop"), (f"The answer is {gold[1]}.", "stop"), (f"so {gold[2]}", "stop")])
    found = diagnosis.evaluations("arm", cold_start=True)
    assert (found["rl_gained"], found["rl_lost"]) == (2, 1)  # the last two gained, the first lost
    assert found["rl_start"]["correct"] == pytest.approx(1 / 3)
    assert found["rl_start"]["boxed"] == pytest.approx(1 / 3)
    assert found["rl_start"]["cut"] == pytest.approx(1 / 3)
    assert found["rl_start"]["extractable"] == pytest.approx(2 / 3)  # "no idea" holds no number
    assert found["after"]["gsm8k_line"] == pytest.approx(1 / 3)
    assert "before" not in found
    assert diagnosis.evaluations("arm", cold_start=False).keys() == {"rl_start", "after"}  # no base evaluation here


def test_curves_read_while_the_run_existed_are_kept_once_it_is_gone(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    report = json.loads((diagnosis.RESULTS / "gsm8k_grpo_band_cold_start.json").read_text())
    monkeypatch.setattr(diagnosis, "RESULTS", tmp_path)
    earlier = {"run_curves": {"kl/mean": [0.01, 0.02]}, "evaluations": {"rl_gained": 27, "rl_lost": 44},
               "reward_curve": report["reward_curve"], "length_curve": report["length_curve"]}
    gone = diagnosis.stage("grpo_band_cold_start", report, earlier)
    assert gone["run_curves"] == earlier["run_curves"] and gone["evaluations"] == earlier["evaluations"]
    assert "run_curves" not in diagnosis.stage("grpo_band_cold_start", report)  # nothing read, nothing kept
    another_run = {**earlier, "reward_curve": [0.0] * len(report["reward_curve"])}  # the arm run again since
    assert "run_curves" not in diagnosis.stage("grpo_band_cold_start", report, another_run)
    run = tmp_path / "gsm8k" / "grpo_band_cold_start" / "run"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "kl/mean": 0.5}) + "\n")
    assert diagnosis.stage("grpo_band_cold_start", report, earlier)["run_curves"]["kl/mean"] == [0.5]  # the disk's
