"""The `reasonrl` command: a smoke run on a tiny model, --help, and config errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import EXPECTED_RECIPES

from reasonrl.commands.cli import main
from reasonrl.config import ConfigError, load_config


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "reasonrl.commands.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def test_train_smoke_run_on_a_tiny_model(tiny_model_dir, tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('[rollout]\nprompts_per_step = 2\ngroup_size = 2\nmax_new_tokens = 4\n'
                      '[task]\ntrain_size = 20\ntest_size = 4\n')
    code = main(["train", str(config), f"model.name={tiny_model_dir}", f"run.dir={tmp_path / 'run'}",
                 "train.steps=2", "eval.problems=2", "eval.samples=1", "run.progress=false"])
    assert code == 0
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 2]  # eval before, two training steps, eval after
    assert (tmp_path / "run" / "checkpoints" / "step_000002" / "policy" / "model.safetensors").is_file()


def test_help_lists_every_knob():
    result = run_cli("train", "--help")
    assert result.returncode == 0
    for knob in ("model.name", "algo.clip_high", "train.lr", "rollout.group_size", "eval.samples", "run.resume"):
        assert knob in result.stdout


@pytest.mark.parametrize("args, message", [
    (["algo.clip_hgh=0.3"], "unknown config key 'algo.clip_hgh'; keys of [algo]: advantage"),
    (["algo.advantage=grpoo"], "algo.advantage: 'grpoo' is not allowed; allowed: grpo"),
    (["train.lr=fast"], "train.lr: expected float, got 'fast'"),
    (["rollout.temperature=-1"], "rollout.temperature: -1.0 is below its minimum 0.0"),
    (["missing.toml"], "'missing.toml' is neither a config file nor a recipe name (recipes: cispo"),
])
def test_config_errors_name_the_key_and_the_fix(args, message, capsys):
    assert main(["train", *args]) == 2
    assert message in capsys.readouterr().err


def test_every_recipe_says_where_it_differs_and_multi_update_recipes_set_their_lr():
    # Several optimizer steps per rollout batch at the one-step default lr would move each batch
    # several times as far: such a recipe must choose its lr and say why.
    import tomllib

    from reasonrl.recipes import recipes

    for recipe in recipes():
        text = recipe.path.read_text()
        header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
        assert "Differs:" in header, f"{recipe.name}: the leading comment must say where it differs from its paper"
        cfg = load_config(recipe.path, recipe_needs(recipe.name))
        if cfg.train.ppo_epochs * cfg.train.mini_batches > 1:
            assert "lr" in tomllib.loads(text).get("train", {}), f"{recipe.name} takes several optimizer steps per " \
                                                                 "batch and must set train.lr explicitly"
            assert "lr" in header.split("Differs:")[1], f"{recipe.name}: say why its lr differs"


def recipe_needs(name: str) -> list[str]:
    """What a recipe needs from its command line: the distill recipe a teacher (`reasonrl distill --teacher`)."""
    return ["distill.teacher=self"] if name == "distill" else []


def test_the_distill_recipe_without_a_teacher_says_to_name_one():
    from reasonrl.recipes import config_path

    with pytest.raises(ConfigError, match=r"distill.reward_weight=0.0 has no effect.*distill --teacher MODEL"):
        load_config(config_path("distill"))


def test_recipes_are_listed_with_a_line_each_and_load(capsys):
    from reasonrl.recipes import config_path, recipes

    assert main(["recipes"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line and not line.startswith("run one")]
    assert {line.split()[0] for line in lines} == EXPECTED_RECIPES
    for recipe in recipes():
        assert recipe.summary and "(" in recipe.summary, recipe  # says what it is and whose it is
        cfg = load_config(config_path(recipe.name), recipe_needs(recipe.name))
        defaults = load_config()
        # every recipe changes something, and only through known keys (load_config would refuse others)
        assert cfg != defaults, recipe.name
