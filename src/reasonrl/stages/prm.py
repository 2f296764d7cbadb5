"""Training a process reward model on Monte Carlo step labels (`stages.prm_labels`), in either
form the project reads. Both see the question and the steps, each step followed by a step tag:
- generative (`rewards.prm.ModelPRM`): a causal LM scoring a step by P("+") against P("-") at
  its tag (Wang et al. 2024, Math-Shepherd, §3.1 and its released checkpoint), z the LM's logits;
- classifier (`rewards.prm.ClassifierPRM`): the same base model with a 2-label token
  classification head (transformers' `AutoModelForTokenClassification`, the head newly
  initialised) scoring a step by softmax(z)[1] at its tag, z the head's two logits, as
  Qwen2.5-Math-PRM reads its separators.
With m_i = z[+] - z[-] (the classifier: z[1] - z[0]) at step i's tag, the PRM's score is
sigmoid(m_i) in both forms, and the loss is the binary cross-entropy

    L = -(1/S) * sum_i [ y_i log sigmoid(m_i) + (1 - y_i) log(1 - sigmoid(m_i)) ]

over the S step tags of a batch, against the soft or the hard labels y_i; no other position and no
other vocabulary entry is a target (Math-Shepherd's PRM loss, with soft labels allowed). The
saved directory is a transformers model with its tokenizer, so `reward.process_model=DIR` and
`reasonrl eval --prm DIR` load it by its architecture (default step tag "\\n\\n", template
"{question} {steps}").

The loop is hand-written rather than run through `training.learner.Learner`: the learner's update
takes per-token policy-gradient losses on completion tokens, while this loss reads two vocabulary
entries at tag positions spread over the question-and-steps input; the loop is a few lines of
AdamW. Held-out problems (all the solutions of a problem on one side) are scored through
the PRM's own `score_steps`, so the reported accuracy and AUC are those of the scorer the
reward uses. The AUC is hand-rolled (the Mann-Whitney statistic, a dozen lines) rather than taken
from scikit-learn, which the project does not otherwise depend on.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from reasonrl.rewards.prm import ClassifierPRM, ModelPRM, StepTagFormat, logits_at, right_padded
from reasonrl.sampling import EpochSampler
from reasonrl.seeds import derive_seed
from reasonrl.stages.prm_labels import LabeledSolution, read_step_labels


@dataclass(frozen=True)
class PRMSettings:
    """`label`: train on the "soft" (share of verified completions) or "hard" (any verified) labels;
    `form`: a "generative" ("+"/"-") or a "classifier" (token-classification head) PRM; `held_out`: the share of problems kept out of training for the evaluation; `batch_size`
    solutions per optimizer step; `dtype`: the training step's compute dtype (weights and optimizer
    stay float32), "auto" = bfloat16 autocast where the hardware has it fast, as `train.dtype`;
    `save_every`: steps between checkpoints to resume from (0: none)."""

    label: Literal["soft", "hard"] = "soft"
    form: Literal["generative", "classifier"] = "generative"
    steps: int = 200
    batch_size: int = 8
    lr: float = 1e-5
    weight_decay: float = 0.0
    held_out: float = 0.1
    seed: int = 0
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    save_every: int = 50

    def __post_init__(self) -> None:
        if self.label not in ("soft", "hard"):
            raise ValueError(f"PRM training: label must be 'soft' or 'hard', got {self.label!r}")
        if self.form not in ("generative", "classifier"):
            raise ValueError(f"PRM training: form must be 'generative' or 'classifier', got {self.form!r}")
        if self.steps < 0 or self.batch_size < 1 or not self.lr > 0 or self.save_every < 0:
            raise ValueError(f"PRM training needs steps >= 0, batch_size >= 1, lr > 0 and save_every >= 0, got "
                             f"steps={self.steps}, batch_size={self.batch_size}, lr={self.lr}, "
                             f"save_every={self.save_every}")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"PRM training: dtype must be 'auto', 'float32' or 'bfloat16', got {self.dtype!r}")
        if not 0 <= self.held_out < 1:
            raise ValueError(f"PRM training: held_out is a share of the problems in [0, 1), got {self.held_out}")


def tag_margins(at_tags_SC: torch.Tensor, positive: int, negative: int) -> torch.Tensor:
    """m = z[positive] - z[negative] from the logits at the step tags (`rewards.prm.logits_at`),
    in float32. (S, C) -> (S,)."""
    at_tags_SC = at_tags_SC.float()
    return at_tags_SC[:, positive] - at_tags_SC[:, negative]


def prm_loss(margins_S: torch.Tensor, labels_S: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy of sigmoid(margins) against labels in [0, 1]. (S,), (S,) -> ()."""
    return F.binary_cross_entropy_with_logits(margins_S, labels_S.to(margins_S))


def auc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """The area under the ROC curve: the probability that a random positive scores above a random
    negative, ties counting one half (the Mann-Whitney U statistic over n+ * n- pairs, from ranks with
    ties averaged). NaN when one class is absent."""
    positives = sum(1 for label in labels if label)
    negatives = len(labels) - positives
    if not positives or not negatives:
        return math.nan
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and scores[order[end + 1]] == scores[order[start]]:
            end += 1
        for i in order[start:end + 1]:
            ranks[i] = (start + end) / 2 + 1  # the average 1-based rank of the tied run
        start = end + 1
    rank_sum = sum(rank for rank, label in zip(ranks, labels) if label)
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def split_by_problem(rows: Sequence[LabeledSolution], held_out: float, seed: int,
                     ) -> tuple[list[LabeledSolution], list[LabeledSolution]]:
    """(train, held-out): round(held_out * problems) problems, at least one when held_out > 0,
    chosen by a seeded hash of their ids, all of a problem's solutions on the same side."""
    ids = sorted({row.problem_id for row in rows})
    count = max(1, round(held_out * len(ids))) if held_out > 0 else 0
    if count >= len(ids) and count:
        raise ValueError(f"PRM training: holding out {count} of {len(ids)} problems leaves none to train on; lower "
                         "held_out or label more problems")
    kept_out = set(sorted(ids, key=lambda i: derive_seed(seed, "held-out", i))[:count])
    return ([row for row in rows if row.problem_id not in kept_out], [row for row in rows if row.problem_id in kept_out])


def evaluate_prm(prm: ModelPRM | ClassifierPRM, rows: Sequence[LabeledSolution]) -> dict[str, float]:
    """Step-level accuracy (score > 0.5 against the hard label) and AUC of `prm` on `rows`."""
    by_problem: dict[str, list[LabeledSolution]] = defaultdict(list)
    for row in rows:
        if row.steps:
            by_problem[row.problem_id].append(row)
    scores: list[float] = []
    labels: list[int] = []
    for group in by_problem.values():
        for row, row_scores in zip(group, prm.score_steps(group[0].problem(), [row.steps for row in group])):
            scores += row_scores
            labels += row.hard
    if not labels:
        return {"steps": 0, "accuracy": math.nan, "auc": math.nan, "positive_share": math.nan}
    accuracy = sum((score > 0.5) == bool(label) for score, label in zip(scores, labels)) / len(labels)
    return {"steps": len(labels), "accuracy": accuracy, "auc": auc(scores, labels),
            "positive_share": sum(labels) / len(labels)}


def _encoded(tokenizer: Any, fmt: StepTagFormat, rows: Sequence[LabeledSolution],
             label: str) -> list[tuple[list[int], list[int], list[float]]]:
    """Each solution with steps as (input ids, tag positions, labels)."""
    out = []
    for row in rows:
        if row.steps:
            ids, tags = fmt.encode(tokenizer, row.problem(), row.steps)
            out.append((ids, tags, [float(y) for y in (row.soft if label == "soft" else row.hard)]))
    return out


def prm_step(model: Any, optimizer: torch.optim.Optimizer, batch: Sequence[tuple[list[int], list[int], list[float]]],
             pad_id: int, candidates: tuple[int, int], autocast_dtype: torch.dtype = torch.float32) -> float:
    """One AdamW step of `prm_loss` on a batch of encoded solutions (right-padded: under causal
    attention padding changes no logit at a tag), the forward and backward under autocast to
    `autocast_dtype` unless float32 (the weights and AdamW's state stay float32); returns the loss."""
    device = next(model.parameters()).device
    input_ids_BT, attention_BT = right_padded([ids for ids, _, _ in batch], pad_id)
    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype != torch.float32):
        at_tags_SC = logits_at(model, input_ids_BT.to(device), attention_BT.to(device), [tags for _, tags, _ in batch])
    margins_S = tag_margins(at_tags_SC, *candidates)
    loss = prm_loss(margins_S, torch.tensor([y for _, _, labels in batch for y in labels], device=device))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


def train_prm(model_path: str, labels: str | Path | Sequence[LabeledSolution], out: str | Path,
              settings: PRMSettings = PRMSettings(), *, device: str | torch.device = "cpu",
              progress: bool = True) -> dict[str, Any]:
    """Fine-tune the causal LM `model_path` into a PRM on step labels (a file or rows), save it to
    `out` with its tokenizer, and return the report also written to OUT/prm_metrics.json: the
    held-out accuracy and AUC before and after training, the mean loss of the last steps.

    Every `settings.save_every` steps the training state is checkpointed in OUT/checkpoints; a
    later call with the same `out`, labels and settings (`steps` may differ) resumes from it, to
    the same weights as an uninterrupted run. The checkpoints are removed once the PRM is saved."""
    from reasonrl.models import load_tokenizer, resolve_dtype, resolve_model_path
    from reasonrl.training.checkpoint import save_checkpoint

    rows = read_step_labels(labels) if isinstance(labels, (str, Path)) else list(labels)
    train_rows, held_out_rows = split_by_problem(rows, settings.held_out, settings.seed)
    local_path = resolve_model_path(model_path)  # the built-in default's converted weights, a checkpoint's policy
    tokenizer = load_tokenizer(local_path)
    torch.manual_seed(settings.seed)
    prm, candidates = _untrained_prm(local_path, tokenizer, settings.form, device)
    model = prm.model
    encoded = _encoded(tokenizer, prm.fmt, train_rows, settings.label)
    if not encoded and settings.steps:
        raise ValueError("PRM training: no training solution has a step; label more problems or lower held_out")
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay,
                                  fused=torch.device(device).type in ("cpu", "cuda"))
    sampler = EpochSampler(max(1, len(encoded)), seed=settings.seed)
    out = Path(out)
    identity = {"settings": {k: v for k, v in asdict(settings).items() if k != "steps"},
                "labels": _fingerprint(train_rows), "base_model": model_path}
    state = _resume(out, identity, model, optimizer, sampler)
    before = state["before"] if state else evaluate_prm(prm, held_out_rows)
    losses: list[float] = state["losses"] if state else []
    autocast_dtype = resolve_dtype(settings.dtype, torch.device(device))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    bar = tqdm(total=settings.steps, initial=len(losses), desc="prm", unit="step", disable=not progress)
    model.train()
    for step in range(len(losses) + 1, settings.steps + 1):
        batch = [encoded[i] for i in sampler.next(min(settings.batch_size, len(encoded)))]
        losses.append(prm_step(model, optimizer, batch, pad_id, candidates, autocast_dtype))
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
        bar.update()
        if settings.save_every and step % settings.save_every == 0 and step < settings.steps:
            save_checkpoint(out, step, model=model, tokenizer=tokenizer, keep=1, state={
                "identity": identity, "before": before, "losses": losses, "optimizer": optimizer.state_dict(),
                "sampler": sampler.state_dict(), "rng": _rng_state()})
    bar.close()
    model.eval()
    report = {"settings": asdict(settings), "base_model": model_path, "form": settings.form, "train_solutions": len(train_rows),
              "held_out_solutions": len(held_out_rows), "before": before, "after": evaluate_prm(prm, held_out_rows),
              "final_loss": sum(losses[-10:]) / len(losses[-10:]) if losses else math.nan,
              "resumed_from": state["step"] if state else None}
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # NaN (an AUC over one class, no held-out steps) is written as null: strict JSON readers reject NaN.
    (out / "prm_metrics.json").write_text(json.dumps(_nan_as_none(report), indent=2) + "\n")
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    return report


def _fingerprint(rows: Sequence[LabeledSolution]) -> str:
    """A hash of the training rows: a checkpoint resumes only on the labels it was trained on."""
    return hashlib.sha256(json.dumps([asdict(row) for row in rows], sort_keys=True).encode()).hexdigest()


def _rng_state() -> dict[str, Any]:
    return {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def _resume(out: Path, identity: dict[str, Any], model: Any, optimizer: torch.optim.Optimizer,
            sampler: EpochSampler) -> dict[str, Any] | None:
    """Load OUT's latest checkpoint into the model, optimizer, sampler and random state, and return
    its state (step, losses, the before-training evaluation); None when OUT has none."""
    from reasonrl.training.checkpoint import latest_checkpoint, load_policy_weights, load_trainer_state

    checkpoint = latest_checkpoint(out)
    if checkpoint is None:
        return None
    state = load_trainer_state(checkpoint)
    if state["identity"] != identity:
        changed = sorted(key for key in identity if state["identity"].get(key) != identity[key])
        raise ValueError(f"PRM training: {checkpoint} was trained with other {' and '.join(changed)}; resume with the "
                         f"same ones, or delete {out / 'checkpoints'} (or choose another output directory) to start "
                         "again")
    load_policy_weights(model, checkpoint)
    optimizer.load_state_dict(state["optimizer"])
    sampler.load_state_dict(state["sampler"])
    torch.set_rng_state(state["rng"]["cpu"])
    if state["rng"]["cuda"]:
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return state


def _untrained_prm(model_path: str, tokenizer: Any, form: str, device: str | torch.device,
                   ) -> tuple[ModelPRM | ClassifierPRM, tuple[int, int]]:
    """The PRM to train, in float32 on `device`, and the (positive, negative) entries of its logits
    whose difference is the step's margin: the "+"/"-" tokens, or the classifier's labels 1 and 0.
    Building it checks the tokenizer (offsets; "+" and "-" one token each) before any work."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    if form == "classifier":
        model = AutoModelForTokenClassification.from_pretrained(model_path, num_labels=2, dtype=torch.float32)
        return ClassifierPRM(model=model.to(device).eval(), tokenizer=tokenizer, label=1), (1, 0)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device).eval()
    prm = ModelPRM(model=model, tokenizer=tokenizer)
    return prm, prm.candidate_ids


def _nan_as_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _nan_as_none(item) for key, item in value.items()}
    return None if isinstance(value, float) and math.isnan(value) else value


__all__ = ["PRMSettings", "auc", "evaluate_prm", "prm_loss", "prm_step", "split_by_problem", "tag_margins",
           "train_prm"]
