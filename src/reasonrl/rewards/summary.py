"""What scored groups say, as metrics: the mean reward and each component, completion length and
truncation (`summarize`), and the reward and accuracy of each source of a mixture (`by_source`).
Shared by the rollout producer, the trainer's participants and evaluation."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from reasonrl.types import CORRECT, Group


def summarize(groups: Sequence[Group], prefix: str) -> dict[str, float]:
    """Mean reward, each reward component, completion length and truncation over scored groups."""
    completions = [c for g in groups for c in g.completions]
    count = max(len(completions), 1)
    metrics = {
        f"{prefix}reward_mean": sum(r for g in groups for r in g.rewards) / count,
        f"{prefix}len_mean": sum(len(c.token_ids) for c in completions) / count,
        f"{prefix}truncated_frac": sum(c.finish_reason == "length" for c in completions) / count,
    }
    for name in groups[0].reward_components if groups else ():
        metrics[f"{prefix}{name}"] = sum(v for g in groups for v in g.reward_components[name]) / count
    return metrics


def by_source(groups: Sequence[Group], key: Callable[[str], str]) -> dict[str, float]:
    """Mean reward and accuracy of the groups of each `metadata["source"]`, under the names `key(metric) + source`."""
    sources: dict[str, list[Group]] = {}
    for group in groups:
        sources.setdefault(str(group.problem.metadata.get("source", "unknown")), []).append(group)
    metrics = {}
    for source, members in sorted(sources.items()):
        values = summarize(members, "")
        metrics[key("reward_mean") + source] = values["reward_mean"]
        if CORRECT in values:
            metrics[key("accuracy") + source] = values[CORRECT]
    return metrics
