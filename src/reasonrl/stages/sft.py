"""Supervised fine-tuning on (prompt, solution) pairs: the cold start before RL (DeepSeek-R1's
"cold-start data"), and the inner step of rejection-sampling fine-tuning.

The loss is the mean negative log-likelihood of the solution tokens only (the prompt is context,
never a target), over all solution tokens of the batch. It is exactly the policy-gradient loss
`reinforce` with every advantage 1 under `token_mean` aggregation, so SFT runs through the same
learner as RL: micro-batches of similar length (only solution positions go through the LM head),
bfloat16 autocast, LoRA, checkpoints and resume. Sequences are not packed into one row: the
learner's length-sorted micro-batches already keep padding small, and packing would need
attention masks across documents that the CPU kernels do not support.

Data: a Task whose problems carry the solution as `answer` (`task.answer_field` names the
solution field of a JSONL file). Each solution is tokenised once, without special tokens, and
ends with the end-of-sequence token so that the model learns to stop.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from reasonrl.algo.aggregation import token_mean
from reasonrl.algo.objectives import reinforce
from reasonrl.build import build_policy, build_supervised_learner, build_task
from reasonrl.config import Config
from reasonrl.sampling import EpochSampler
from reasonrl.tasks import Task
from reasonrl.training.learner import Learner, PolicyLoss, make_train_batch
from reasonrl.training.skeleton import PolicyCheckpoints, RunLoop, show_metrics, start_stage
from reasonrl.training.targets import sft_group
from reasonrl.types import Group

SFT_LOSS = PolicyLoss(objective=reinforce, aggregation=token_mean)


def sft_update(learner: Learner, groups: Sequence[Group], pad_id: int, *, micro_batch_size: int,
               step: int = 0) -> dict[str, float]:
    """One optimizer step of the SFT loss on `groups`; metrics `loss/sft` (mean NLL per token)."""
    batch = make_train_batch(groups, [1.0] * sum(g.size for g in groups), pad_id)
    metrics = learner.update(batch, SFT_LOSS, micro_batch_size=micro_batch_size, step=step)
    metrics["loss/sft"] = metrics.pop("loss/policy")
    metrics.pop("rollout/logp_gap", None)  # no sampler: the targets were not sampled
    return metrics


def train_sft(cfg: Config, *, task: Task | None = None) -> Path:
    """Fine-tune cfg.model on the solutions of `task.train` (default: cfg.task) for cfg.train.steps
    steps of cfg.sft.batch_size examples; returns the final checkpoint directory.

    Resumable like `train` (`run.resume=true`): the example order and the optimizer continue.
    """
    start = start_stage(cfg)
    cfg, device = start.cfg, start.device
    task = build_task(cfg, task)
    tokenizer, model = build_policy(cfg, device, start.resume_from)
    learner = build_supervised_learner(cfg, model, device)
    groups = [sft_group(tokenizer, p, chat_template=cfg.model.chat_template, max_tokens=cfg.sft.max_tokens)
              for p in task.train]
    sampler = EpochSampler(len(groups), seed=cfg.run.seed)
    stateful = {"learner": learner, "sampler": sampler}
    loop = RunLoop.open(start, stateful, save=PolicyCheckpoints(start, stateful, model=model, tokenizer=tokenizer),
                        desc="sft", show=show_metrics(loss=("loss/sft", ".3f"), log_every=cfg.run.log_every))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def step() -> dict[str, float]:
        started = time.perf_counter()
        chosen = [groups[i] for i in sampler.next(cfg.sft.batch_size)]
        metrics = sft_update(learner, chosen, pad_id, micro_batch_size=cfg.train.micro_batch_size, step=loop.step)
        return metrics | {"perf/step_s": time.perf_counter() - started}

    return loop.run_steps(step)


__all__ = ["SFT_LOSS", "sft_group", "sft_update", "train_sft"]
