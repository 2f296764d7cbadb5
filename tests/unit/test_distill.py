"""On-policy distillation's pieces: the per-token advantage by hand on a 2-token example, the
estimation step that adds it, a local teacher's log-probs (invariant to its micro-batches, equal to the
learner's at temperature 1), the refusal of a teacher with another tokenizer, and self:STEP teachers."""

from __future__ import annotations

import string

import pytest
import torch
from helpers import char_tokenizer

from reasonrl.algo.distill import reverse_kl_advantages
from reasonrl.methods.distill import DistilledEstimation, teacher_checkpoint
from reasonrl.models import load_model, load_tokenizer
from reasonrl.training.learner import Learner, OptimConfig, make_train_batch
from reasonrl.training.teachers import LocalTeacher, TokenizerMismatchError, check_same_tokenizer
from reasonrl.types import Completion, Group, Problem

# One sequence: a prompt token, then 2 completion tokens, then padding (position 2 is not trained).
STUDENT_NT = torch.tensor([[-0.5, -2.0, 0.0]])
TEACHER_NT = torch.tensor([[-1.0, -0.1, -3.0]])
MASK_NT = torch.tensor([[1.0, 1.0, 0.0]])
REWARD_ADV_NT = torch.tensor([[0.5, 0.5, 0.0]])


def test_advantage_is_the_reward_plus_the_weighted_negative_reverse_kl_by_hand():
    # reverse KL per token: -0.5 - (-1.0) = 0.5 and -2.0 - (-0.1) = -1.9;
    # A_t = 1 * 0.5 - 2 * 0.5 = -0.5 and 1 * 0.5 - 2 * (-1.9) = 4.3; the padding position stays 0.
    adv_NT, metrics = reverse_kl_advantages(REWARD_ADV_NT, STUDENT_NT, TEACHER_NT, MASK_NT, weight=2.0,
                                            reward_weight=1.0)
    torch.testing.assert_close(adv_NT, torch.tensor([[-0.5, 4.3, 0.0]]))
    assert metrics["distill/reverse_kl"] == pytest.approx((0.5 - 1.9) / 2)
    assert metrics["distill/teacher_logp"] == pytest.approx((-1.0 - 0.1) / 2)
    assert metrics["distill/student_logp"] == pytest.approx((-0.5 - 2.0) / 2)


def test_distillation_alone_ignores_the_reward_and_a_teacher_equal_to_the_student_changes_nothing():
    alone_NT, _ = reverse_kl_advantages(REWARD_ADV_NT, STUDENT_NT, TEACHER_NT, MASK_NT, reward_weight=0.0)
    torch.testing.assert_close(alone_NT, torch.tensor([[-0.5, 1.9, 0.0]]))
    same_NT, metrics = reverse_kl_advantages(REWARD_ADV_NT, STUDENT_NT, STUDENT_NT, MASK_NT, weight=3.0)
    torch.testing.assert_close(same_NT, REWARD_ADV_NT)
    assert metrics["distill/reverse_kl"] == 0.0


def test_negative_weights_are_refused():
    with pytest.raises(ValueError, match="must be >= 0"):
        reverse_kl_advantages(REWARD_ADV_NT, STUDENT_NT, TEACHER_NT, MASK_NT, weight=-1.0)


class FixedTeacher:
    def __init__(self, logp_NT):
        self.logp_NT = logp_NT

    def logprobs(self, batch):
        return self.logp_NT

    def check_tokenizer(self, student_tokenizer):
        return None


def test_estimation_adds_the_teacher_term_with_the_samplers_logprobs():
    completion = Completion(token_ids=(7, 8), text="", logprobs=(-0.5, -2.0), finish_reason="stop")
    group = Group(problem=Problem(id="p", prompt="x", answer=""), prompt_ids=(3,), completions=(completion,),
                  rewards=(1.0,))

    def estimate(groups, pad_id, kl_coef):
        return make_train_batch(groups, [0.5], pad_id), {"kl/mean": 0.0}

    distilled = DistilledEstimation(estimate, FixedTeacher(torch.tensor([[-1.0, -0.1]])), weight=2.0)
    batch, metrics = distilled([group], pad_id=0, kl_coef=0.0)
    torch.testing.assert_close(batch.advantages_NT, torch.tensor([[-0.5, 4.3]]))
    assert set(metrics) == {"kl/mean", "distill/reverse_kl", "distill/teacher_logp", "distill/student_logp"}


def test_local_teacher_is_the_learners_temperature_1_logprobs_whatever_its_micro_batches(tiny_model_dir):
    model = load_model(str(tiny_model_dir), dtype=torch.float32, device=torch.device("cpu"))
    completions = tuple(Completion(token_ids=tuple(range(10, 10 + n)), text="", logprobs=(-1.0,) * n,
                                   finish_reason="stop") for n in (2, 5, 3))
    group = Group(problem=Problem(id="p", prompt="x", answer=""), prompt_ids=(2, 3, 4), completions=completions)
    batch = make_train_batch([group], [0.0] * 3, pad_id=0)
    one_by_one = LocalTeacher(model, load_tokenizer(str(tiny_model_dir)), name="t", micro_batch_size=1)
    together = LocalTeacher(model, None, name="t", micro_batch_size=8)
    torch.testing.assert_close(one_by_one.logprobs(batch), together.logprobs(batch), atol=1e-6, rtol=0)
    learner = Learner(model, OptimConfig(), temperature=1.0)
    torch.testing.assert_close(together.logprobs(batch), learner.logprobs(model, batch, 8), atol=1e-6, rtol=0)
    assert (together.logprobs(batch)[batch.loss_mask_NT == 0] == 0).all()


def test_a_teacher_with_another_tokenizer_is_refused():
    chars = "".join(sorted(set(string.printable) - set("\x0b\x0c")))
    student = char_tokenizer(chars)
    check_same_tokenizer(student, char_tokenizer(chars), "same")
    with pytest.raises(TokenizerMismatchError, match="token ids differ"):
        check_same_tokenizer(student, char_tokenizer(chars[::-1]), "reordered")
    with pytest.raises(TokenizerMismatchError, match="vocabulary sizes"):
        check_same_tokenizer(student, char_tokenizer(chars[:-1]), "smaller")


def test_self_step_names_a_checkpoint_of_the_run(tmp_path):
    (tmp_path / "checkpoints" / "step_000010" / "policy").mkdir(parents=True)
    assert teacher_checkpoint("self:step_000010", tmp_path).name == "step_000010"
    assert teacher_checkpoint("self:10", tmp_path).name == "step_000010"
    with pytest.raises(FileNotFoundError, match="available: step_000010"):
        teacher_checkpoint("self:20", tmp_path)
    with pytest.raises(ValueError, match="expected self:step_NNNNNN"):
        teacher_checkpoint("self:last", tmp_path)


def test_distillation_with_ray_workers_is_refused_at_config_time():
    from reasonrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="run.backend=local"):
        load_config(overrides=["distill.teacher=some/model", "run.backend=ray"])
