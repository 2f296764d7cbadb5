"""What a report says a run was set to: the recipe it follows and what it set beyond it, read from
config.toml alone; and the settings that differ between runs."""

from __future__ import annotations

from reasonrl.config import load_config
from reasonrl.recipes import config_path, recipes
from reasonrl.report.settings import differing, settings_of


def described(recipe: str | None, *overrides: str) -> str:
    return settings_of(load_config(config_path(recipe) if recipe else None, list(overrides)).to_dict()).describe()


def test_each_recipe_is_named_by_its_own_settings():
    for recipe in recipes():
        if recipe.name == "distill":  # loads only with a teacher
            assert described("distill", "distill.teacher=t") == "recipe distill + distill.teacher=t"
            continue
        assert described(recipe.name) == f"recipe {recipe.name}"


def test_overrides_beyond_a_recipe_are_named_with_their_values():
    assert described("gspo", "train.lr=2e-6") == "recipe gspo + train.lr=2e-06"  # one of the recipe's, set otherwise
    assert described("dapo", "run.seed=3", "sampling.dynamic=false") == \
        "recipe dapo + run.seed=3 + sampling.dynamic=False"


def test_a_run_without_a_recipe_lists_its_changes_from_the_defaults():
    assert described(None) == "defaults"
    assert described(None, "algo.clip_high=0.28", "train.lr=1e-5") == "defaults + algo.clip_high=0.28 + train.lr=1e-05"


def test_partial_and_older_configs_are_read_as_written():
    # run.dir is left out (it differs in every run); a key this version does not know counts as a change.
    config = {"run": {"dir": "runs/x"},
              "algo": {"objective": "gspo", "aggregation": "seq_mean_token_mean", "clip_low": 3e-4, "clip_high": 4e-4},
              "sampling": {"mask_truncated": False}, "train": {"mini_batches": 4, "lr": 1e-5}, "old": {"knob": 1}}
    assert settings_of(config).describe() == "recipe gspo + old.knob=1"


def test_differing_settings_list_each_runs_value_with_defaults_for_keys_left_out():
    a = {"train": {"lr": 1e-5, "steps": 3}, "run": {"dir": "a"}}
    b = {"train": {"lr": 2e-6, "steps": 3}, "algo": {"clip_high": 0.28}, "run": {"dir": "b"}}
    default_clip = load_config().algo.clip_high
    assert differing([a, b]) == {"algo.clip_high": [default_clip, 0.28], "train.lr": [1e-5, 2e-6]}


def test_a_conversation_prompt_is_shown_message_by_message_under_its_role():
    from reasonrl.report.data import prompt_text

    conversation = [{"role": "system", "content": "Reason first."}, {"role": "user", "content": "What is 2 + 3?"}]
    assert prompt_text(conversation) == "[system]\nReason first.\n\n[user]\nWhat is 2 + 3?"
    assert prompt_text("What is 2 + 3?") == "What is 2 + 3?" and prompt_text(None) == ""
