"""How far a bfloat16 rollout engine's log-probs sit from the policy's, by position: the engine's copy
as reasonrl makes it (`models.inference_copy`: weights in bfloat16, RoPE's inverse frequencies kept
in float32, as from_pretrained leaves them) against the copy as it was made before (the whole model
cast, those frequencies included).

SmolLM2-135M-Instruct samples `--samples` completions of `--max-new-tokens` tokens at T = 1 (past
the end-of-sequence token) for arithmetic problems like the default task's; each sequence is then scored teacher-forced by
- the policy in float32 (the reference),
- the policy under bfloat16 autocast (what the learner computes on a CPU with bfloat16 units),
- each engine copy in bfloat16,
and the mean |log-prob - reference| over the completion tokens is reported per bucket of positions.
A cast frequency f is off by up to 2^-9 f, so position p's angle by up to 2^-9 f p: the error grows
with the position. Both copies run the same transformers forward: only the copy differs.

    python -m benchmarks.engine_precision [--samples 8] [--max-new-tokens 1024]
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch

from benchmarks.common import code_version, machine, write_report
from reasonrl.models import SMOLLM2_ID, inference_copy, load_model, load_tokenizer
from reasonrl.rollout import HFEngine
from reasonrl.tasks import arithmetic_task
from reasonrl.types import SamplingParams

BUCKETS = ((0, 64), (64, 256), (256, 512), (512, 1024), (1024, 4096))  # positions in the whole sequence


def token_logprobs(model, ids_T: torch.Tensor, autocast: torch.dtype | None = None) -> torch.Tensor:
    """The log-prob of each token after the first, under `model`, teacher-forced."""
    with torch.no_grad(), torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        logits = model(ids_T[None]).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(-1, ids_T[1:, None])[:, 0]


def gaps_by_position(scored: dict[str, list[torch.Tensor]], starts: list[int]) -> dict[str, dict[str, float]]:
    """Per scorer, the mean |log-prob - float32's| over completion tokens in each bucket of positions."""
    out: dict[str, dict[str, float]] = {}
    for name, per_sequence in scored.items():
        row = {}
        for low, high in BUCKETS:
            gaps = [(logp - ref).abs()[max(low, start - 1):high]
                    for logp, ref, start in zip(per_sequence, scored["float32"], starts)]
            gaps = [g for g in gaps if g.numel()]
            if gaps:
                row[f"{low}-{high}"] = float(torch.cat(gaps).mean())
        out[name] = row
    return out


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=1024)
    parser.add_argument("--name", default="engine_precision")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    policy = load_model(SMOLLM2_ID, dtype=torch.float32, device=cpu)
    tokenizer = load_tokenizer(SMOLLM2_ID)
    engines = {"engine_now": inference_copy(policy, torch.bfloat16),
               "engine_before": copy.deepcopy(policy).to(torch.bfloat16)}
    sampler = HFEngine(engines["engine_now"], tokenizer)
    problems = arithmetic_task(train_size=1, test_size=args.samples, seed=0).test
    groups = sampler.generate(problems, SamplingParams(n=1, temperature=1.0, max_new_tokens=args.max_new_tokens,
                                                       seed=0, ignore_eos=True))
    sequences, starts = [], []
    for problem, group in zip(problems, groups):
        prompt = list(sampler.prompt_ids(problem))
        sequences.append(torch.tensor(prompt + list(group.completions[0].token_ids)))
        starts.append(len(prompt))
    scored = {"float32": [token_logprobs(policy, s) for s in sequences],
              "learner_autocast": [token_logprobs(policy, s, torch.bfloat16) for s in sequences],
              **{name: [token_logprobs(model, s) for s in sequences] for name, model in engines.items()}}
    gaps = gaps_by_position(scored, starts)
    learner = {name: float(torch.cat([(a - b).abs()[start - 1:] for a, b, start in
                                      zip(scored[name], scored["learner_autocast"], starts)]).mean())
               for name in engines}
    report = {"what": __doc__.split("\n\n")[0],
              "settings": {"samples": args.samples, "max_new_tokens": args.max_new_tokens, "temperature": 1.0,
                           "model": SMOLLM2_ID, "task": "arithmetic, 2 operands of 2 digits", "ignore_eos": True},
              "completion_lengths": [len(s) - start for s, start in zip(sequences, starts)],
              "mean_abs_gap_to_float32_by_position": gaps,
              "mean_abs_gap_to_learner_autocast": learner,
              "commit": code_version(), "machine": machine()}
    path = write_report(args.name, report)
    for name, row in gaps.items():
        print(f"{name:>18}: " + "  ".join(f"{bucket} {value:.4f}" for bucket, value in row.items()))
    print("against the learner's autocast:", {k: round(v, 4) for k, v in learner.items()}, "->", path)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
