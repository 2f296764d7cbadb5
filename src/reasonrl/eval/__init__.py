"""Evaluation on held-out problems: greedy and sampled accuracy, reward, length, truncation.

Accuracy is the mean of the reward component named "correct" (answer checked against the gold
answer); tasks whose reward has no such component report reward only. Sample-based metrics
(pass@k, maj@k, mean@k, bootstrap intervals) are in `reasonrl.eval.metrics`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tqdm.auto import tqdm

from reasonrl.eval.chunking import CHUNK_ROWS, problems_per_chunk
from reasonrl.eval.metrics import bootstrap_ci, maj_at_k, mean_at_k, pass_at_k

__all__ = ["CORRECT", "bootstrap_ci", "by_source", "evaluate", "maj_at_k", "mean_at_k", "pass_at_k", "summarize"]
from reasonrl.rewards import WeightedReward, score_groups
from reasonrl.rewards.compose import OnError
from reasonrl.rewards.summary import by_source, summarize
from reasonrl.types import CORRECT, Group, Problem, RolloutEngine, SamplingParams


def evaluate(engine: RolloutEngine, problems: Sequence[Problem], reward: WeightedReward, *,
             temperature: float, samples: int, greedy: bool, max_new_tokens: int, seed: int = 0,
             top_p: float = 1.0, top_k: int = 0,
             stop: tuple[str, ...] = (), chunk_rows: int = CHUNK_ROWS, progress: bool = True,
             on_error: OnError = "stop", per_source: bool = False) -> dict[str, float]:
    """`eval/greedy_*` and `eval/sampled_*` metrics (the latter over `samples` completions per
    problem at `temperature`, `top_p` and `top_k`: the policy as it samples in training). With `on_error="skip_group"`, problems whose reward failed are
    left out and counted in `eval/<mode>_error_groups`. With `per_source`, also
    `eval/<mode>_accuracy/<source>` and `eval/<mode>_reward_mean/<source>` for each
    `metadata["source"]` of a mixture. With several samples and a "correct" component, also
    `eval/sampled_pass@<samples>` and `eval/sampled_maj@<samples>` (the `reasonrl eval` code).

    Problems are generated in chunks of about `chunk_rows` sequences (eval/chunking.py)."""
    modes = []
    if greedy:
        modes.append(("greedy", SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens, stop=stop)))
    if samples > 0 and temperature > 0:
        modes.append(("sampled", SamplingParams(n=samples, temperature=temperature, top_p=top_p, top_k=top_k,
                                                max_new_tokens=max_new_tokens, stop=stop, seed=seed)))
    metrics: dict[str, float] = {}
    bar = tqdm(total=len(modes) * len(problems), desc="eval", leave=False, disable=not progress)
    for mode, sampling in modes:
        groups: list[Group] = []
        size = problems_per_chunk(sampling.n, chunk_rows)
        chunks = [problems[i : i + size] for i in range(0, len(problems), size)]
        for index, chunk in enumerate(chunks):
            chunk_sampling = replace(sampling, seed=sampling.seed + index)
            groups.extend(score_groups(engine.generate(chunk, chunk_sampling), reward, on_error))
            bar.update(len(chunk))
        scored = [group for group in groups if group.reward_error is None]
        mode_metrics = summarize(scored, f"eval/{mode}_")
        mode_metrics[f"eval/{mode}_timeouts"] = float(sum(group.reward_timeouts for group in groups))
        if on_error == "skip_group":
            mode_metrics[f"eval/{mode}_error_groups"] = len(groups) - len(scored)
        if f"eval/{mode}_{CORRECT}" in mode_metrics:
            mode_metrics[f"eval/{mode}_accuracy"] = mode_metrics.pop(f"eval/{mode}_{CORRECT}")
        if per_source:
            mode_metrics |= by_source(scored, lambda metric, mode=mode: f"eval/{mode}_{metric}/")
        if mode == "sampled" and samples > 1 and scored and CORRECT in scored[0].reward_components:
            mode_metrics |= _pass_and_majority(scored, samples)
        metrics.update(mode_metrics)
    bar.close()
    return metrics


def _pass_and_majority(groups: Sequence[Group], samples: int) -> dict[str, float]:
    from reasonrl.eval.run import EvalSettings, mean_logprob_scores, task_metrics

    found = task_metrics(groups, EvalSettings(n=samples, ks=(samples,)), mean_logprob_scores)
    return {f"eval/sampled_{name}@{samples}": found[f"{name}@{samples}"]["value"] for name in ("pass", "maj")}
