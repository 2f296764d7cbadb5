"""The `lora` recipe is the default job on LoRA adapters of rank 16 at the learning rate its study
chose (benchmarks/lora_lr.py, docs/benchmarks.md "LoRA's learning rate"); a run of it checkpoints
the adapters."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import TASK, share_of_a

from reasonrl import load_config, train
from reasonrl.recipes import config_path
from reasonrl.training.checkpoint import checkpoints

STUDY = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "lora_lr" / "summary.json"


def test_the_recipe_is_the_default_job_on_rank_16_adapters_at_the_studys_learning_rate_as_measured():
    recipe, defaults = load_config(config_path("lora")), load_config()
    changed = {f"{section}.{key}" for section, values in recipe.to_dict().items() for key, value in values.items()
               if defaults.to_dict()[section][key] != value}
    assert changed == {"train.lora_rank", "train.lr", "sampling.mask_truncated"}
    assert not recipe.sampling.mask_truncated  # its study ran before the default job filtered cut completions
    assert recipe.train.lora_rank == 16 and recipe.train.lora_alpha == 32.0
    chosen = json.loads(STUDY.read_text())["choice"]["chosen"]
    assert recipe.train.lr == float(chosen)


def test_a_run_of_the_recipe_checkpoints_its_adapters(tiny_model_dir, tmp_path):
    cfg = load_config(config_path("lora"), [f"model.name={tiny_model_dir}", f"run.dir={tmp_path}", "run.progress=false",
                                            "run.tensorboard=false", "rollout.prompts_per_step=2",
                                            "rollout.max_new_tokens=4", "train.steps=1", "eval.problems=0"])
    train(cfg, task=TASK, reward=share_of_a)
    (checkpoint,) = checkpoints(tmp_path)
    adapter = json.loads((checkpoint / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 16 and adapter["lora_alpha"] == 32
