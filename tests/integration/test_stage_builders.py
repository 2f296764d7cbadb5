"""What a stage asks of the builders it shares with the RL loop is said with arguments, never by
rewriting the config: a learner at temperature 1, no reference model."""

from __future__ import annotations

import torch

from reasonrl import load_config
from reasonrl.build import build_learner, build_models, build_policy, build_supervised_learner


def config(model_dir, *extra: str):
    return load_config(overrides=[f"model.name={model_dir}", "rollout.temperature=0.7", "algo.kl_coef=0.05",
                                  "rollout.dtype=float32", *extra])


def test_a_supervised_learner_takes_log_probs_at_temperature_one_and_the_loop_at_the_rollouts(tiny_model_dir):
    cfg = config(tiny_model_dir)
    device = torch.device("cpu")
    _, policy = build_policy(cfg, device, None)
    assert build_supervised_learner(cfg, policy, device).temperature == 1.0
    assert build_learner(cfg, policy, device).temperature == 0.7
    assert build_learner(cfg, policy, device, temperature=1.0).temperature == 1.0


def test_build_models_leaves_the_reference_out_when_asked_whatever_the_kl_coefficient(tiny_model_dir):
    cfg = config(tiny_model_dir)
    *_, reference = build_models(cfg, torch.device("cpu"), None)
    *_, none = build_models(cfg, torch.device("cpu"), None, reference=False)
    assert reference is not None and none is None


def test_a_tokenizer_without_a_chat_template_is_named_when_one_is_asked_for(tiny_model_dir, tmp_path, capsys):
    import shutil

    from transformers import AutoTokenizer

    plain = tmp_path / "plain"
    shutil.copytree(tiny_model_dir, plain)
    tokenizer = AutoTokenizer.from_pretrained(plain)
    tokenizer.chat_template = None
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    tokenizer.save_pretrained(plain)
    build_models(config(plain, "algo.kl_coef=0"), torch.device("cpu"), None)
    assert "has no chat template: prompts go to the model as plain text" in capsys.readouterr().err
    build_models(config(plain, "algo.kl_coef=0", "model.chat_template=false"), torch.device("cpu"), None)
    build_models(config(tiny_model_dir, "algo.kl_coef=0"), torch.device("cpu"), None)
    assert "chat template" not in capsys.readouterr().err
