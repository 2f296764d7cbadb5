"""On-policy distillation end to end on tiny models: a teacher served by `reasonrl serve` on loopback
scores as the same model in process; a served teacher with another tokenizer is refused; a student
distilled from a peaked teacher moves its per-token reverse KL down (and up with the sign flipped);
self-distillation starts at a reverse KL of zero; `reasonrl distill` runs and explains itself."""

from __future__ import annotations

import json
import shutil
import string

import pytest
import torch
from helpers import TASK, char_tokenizer, share_of_a, tiny_config

from reasonrl import train
from reasonrl.commands.cli import main
from reasonrl.methods import distill
from reasonrl.models import load_model, load_tokenizer
from reasonrl.rollout.hf import HFEngine
from reasonrl.serve import Server
from reasonrl.training.learner import make_train_batch
from reasonrl.training.teachers import LocalTeacher, ServedTeacher, TokenizerMismatchError
from reasonrl.types import Completion, Group, Problem


def batch_of(lengths, prompt=(2, 3, 4)):
    completions = tuple(Completion(token_ids=tuple(range(10, 10 + n)), text="", logprobs=(-1.0,) * n,
                                   finish_reason="stop") for n in lengths)
    group = Group(problem=Problem(id="p", prompt="x", answer=""), prompt_ids=prompt, completions=completions)
    return make_train_batch([group], [0.0] * len(lengths), pad_id=0)


def cpu_model(path):
    return load_model(str(path), dtype=torch.float32, device=torch.device("cpu"))


def test_a_teacher_served_on_loopback_scores_as_the_local_one(tiny_model_dir):
    model, tokenizer = cpu_model(tiny_model_dir), load_tokenizer(str(tiny_model_dir))
    batch = batch_of((2, 5, 3))
    local = LocalTeacher(model, tokenizer, name="tiny").logprobs(batch)
    with Server(HFEngine(model, tokenizer), "tiny") as server:
        served = ServedTeacher(server.url, request_size=2)
        served.check_tokenizer(tokenizer)
        torch.testing.assert_close(served.logprobs(batch), local, atol=1e-5, rtol=0)
    assert (local[batch.loss_mask_NT.bool()] < 0).all()


def served_with_tokenizer(model_dir, tokenizer, directory):
    """The model of `model_dir` with `tokenizer` in its place, as an HF model directory."""
    shutil.copytree(model_dir, directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (directory / name).unlink(missing_ok=True)
    tokenizer.save_pretrained(directory)
    return Server(HFEngine(cpu_model(directory), load_tokenizer(str(directory))), directory.name)


@pytest.mark.parametrize(("kind", "message"), [("reordered", "ids decode differently"),
                                               ("smaller", "could not score the student's token ids")])
def test_a_served_teacher_with_another_tokenizer_is_refused(kind, message, tiny_model_dir, tmp_path):
    chars = "".join(sorted(set(string.printable) - set("\x0b\x0c")))
    # The tiny models' vocabulary: 6 special tokens, then the characters (conftest).
    tokenizer = char_tokenizer(chars[::-1] + "ÀÁÂÃ") if kind == "reordered" else char_tokenizer(chars)
    student = load_tokenizer(str(tiny_model_dir))
    with served_with_tokenizer(tiny_model_dir, tokenizer, tmp_path / kind) as server, \
            pytest.raises(TokenizerMismatchError, match=message):
        ServedTeacher(server.url).check_tokenizer(student)


def peaked_teacher(directory, seed=1):
    """A tiny model trained towards saying 'a' after anything (half its mass there, the rest spread:
    label smoothing): the reverse KL of the random student can fall towards 0 or rise far."""
    from helpers import build_tiny_model

    build_tiny_model(directory, seed=seed)
    model, tokenizer = cpu_model(directory), load_tokenizer(str(directory))
    target = tokenizer.convert_tokens_to_ids("a")
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    for _ in range(40):
        ids = torch.randint(6, len(tokenizer), (8, 12), generator=generator)
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.full((8 * 12,), target),
                                               label_smoothing=0.5)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(directory)
    return directory


def reverse_kl_curve(run_dir):
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [m["distill/reverse_kl"] for m in lines if "distill/reverse_kl" in m]


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    return peaked_teacher(tmp_path_factory.mktemp("teacher"))


def flipped(advantages_NT, student_logp_NT, teacher_logp_NT, mask_NT, *, weight=1.0, reward_weight=1.0):
    """The distillation term with its sign flipped: a sign error in the advantage."""
    reverse_kl_NT = (student_logp_NT - teacher_logp_NT) * mask_NT
    return (reward_weight * advantages_NT + weight * reverse_kl_NT) * mask_NT, {
        "distill/reverse_kl": float(reverse_kl_NT.sum() / mask_NT.sum())}


@pytest.mark.parametrize("sign", ["right", "flipped"])
def test_the_student_moves_towards_the_teacher_and_a_flipped_sign_moves_it_away(sign, tiny_model_dir, teacher_dir,
                                                                                tmp_path, monkeypatch):
    if sign == "flipped":
        monkeypatch.setattr(distill, "reverse_kl_advantages", flipped)
    run = tmp_path / sign
    train(tiny_config(tiny_model_dir, run, "train.steps=20", f"distill.teacher={teacher_dir}",
                      "distill.reward_weight=0", "distill.dtype=float32", "rollout.prompts_per_step=2",
                      "rollout.group_size=4"), task=TASK, reward=share_of_a)
    curve = reverse_kl_curve(run)
    start, end = sum(curve[:3]) / 3, sum(curve[-5:]) / 5
    # Measured: about 0.6 nats per token at first; 0.1 after 20 steps, or 2.6 with the sign flipped.
    if sign == "right":
        assert end < start / 2, curve
    else:
        assert end > start + 1.0, curve


def test_self_distillation_starts_at_zero_reverse_kl(tiny_model_dir, tmp_path):
    # The teacher is the student's starting weights: at step 1 both score the sampled tokens alike
    # (float32 everywhere, sampling at temperature 1 as the teacher scores).
    train(tiny_config(tiny_model_dir, tmp_path / "self", "train.steps=2", "distill.teacher=self",
                      "distill.dtype=float32"), task=TASK, reward=share_of_a)
    curve = reverse_kl_curve(tmp_path / "self")
    assert len(curve) == 2 and abs(curve[0]) < 1e-4, curve


def test_a_served_copy_of_the_student_as_teacher_starts_at_zero_reverse_kl(tiny_model_dir, tmp_path):
    # distill.teacher=URL through the whole loop: the served model is the student's start, so the
    # first step's reverse KL is 0 up to float32 rounding.
    model, tokenizer = cpu_model(tiny_model_dir), load_tokenizer(str(tiny_model_dir))
    with Server(HFEngine(model, tokenizer), "tiny") as server:
        train(tiny_config(tiny_model_dir, tmp_path / "served", "train.steps=2", f"distill.teacher={server.url}",
                          "distill.request_size=5", "rollout.prompts_per_step=2", "rollout.group_size=4"),
              task=TASK, reward=share_of_a)
    curve = reverse_kl_curve(tmp_path / "served")
    assert len(curve) == 2 and abs(curve[0]) < 1e-4, curve


def test_distill_command_help_and_a_missing_teacher(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["distill", "--help"])
    assert exit_.value.code == 0
    assert "--teacher" in capsys.readouterr().out
    assert main(["distill", "train.steps=1"]) == 2
    assert "distill needs a teacher" in capsys.readouterr().err


def test_distill_command_trains_from_the_recipe(tiny_model_dir, tmp_path):
    run = tmp_path / "cli"
    assert main(["distill", "--teacher", str(tiny_model_dir), f"model.name={tiny_model_dir}", f"run.dir={run}",
                 "run.progress=false", "run.tensorboard=false", "rollout.prompts_per_step=2", "rollout.group_size=2",
                 "rollout.max_new_tokens=4", "train.steps=1", "eval.problems=0", "run.save_every=0",
                 "task.train_size=8", "task.test_size=2"]) == 0
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (step,) = [m for m in metrics if "distill/reverse_kl" in m]
    # the teacher is the student's own start: at the first step their log-probs agree (the engine's
    # float rounding aside), and the step trained
    assert abs(step["distill/reverse_kl"]) < 1e-3 and step["step"] == 1 and "loss/policy" in step


def test_distillation_alone_relaxes_the_no_gradient_alarm_and_with_the_reward_does_not(tiny_model_dir, tmp_path):
    """With distill.reward_weight=0 every group trains on the teacher's term whatever its rewards, so
    groups of equal rewards are no sign of a stalled run: the method sets no_gradient's threshold to 1."""
    from reasonrl.methods.parts import Added, RunParts

    captured: list[Added] = []
    build = distill.build

    def recording(cfg, parts: RunParts) -> Added:
        captured.append(build(cfg, parts))
        return captured[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(distill, "build", recording)
        for weight in (0.0, 1.0):
            train(tiny_config(tiny_model_dir, tmp_path / f"w{weight}", "train.steps=1", "distill.teacher=self",
                              f"distill.reward_weight={weight}"), task=TASK, reward=share_of_a)
    assert [dict(added.alarm_thresholds) for added in captured] == [{"zero_std_max": 1.0}, {}]
