"""From scored groups to the learner's batch: per-token advantages, with whatever the chosen
estimator needs gathered first.

An estimator (reasonrl.algo.advantages) declares its inputs (reasonrl.spec), and only those are computed:
- group estimators get `rewards_BG` (one call per group size when sizes differ: batch-level
  statistics such as grpo_batch_std's are then per size) and may ask for `lengths_BG` (completion tokens),
  `greedy_rewards_B` (the reward of one greedy completion per problem, ReMax's baseline: an extra
  generation per step), `components_KBG` and `weights_K` (each reward component's values as the
  reward logged them, and the reward's weights: GDPO) and `eps`;
- token estimators get `token_rewards_NT` (the outcome reward on the last completion token, or
  with a token-level reward such as a process reward model, `Group.token_rewards`) and `mask_NT`, and may ask for `values_NT` (the critic's, for GAE; the critic's targets are stored
  in the batch), `gamma` and `lam`;
- tree estimators get each group's rewards and the tree it was sampled as (`Group.tree`), and
  give every node's advantage to the node's tokens in each completion through it.
With overlong filtering (`mask_truncated`), completions that hit the length limit keep their place
in the advantage baseline but get no loss.
With the KL penalty in the reward (algo.kl_in=reward), the log-probs of the policy and of the
reference are computed first and kl_coef * KL_t is subtracted: on every token for token
estimators, summed over the completion for group estimators.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from reasonrl.algo.advantages import is_token_level, is_tree_level, lambda_returns, token_rewards
from reasonrl.algo.objectives import masked_mean
from reasonrl.algo.tree import flat_tree, membership_SG
from reasonrl.spec import spec_of
from reasonrl.training.critic import Critic
from reasonrl.training.learner import Learner, make_train_batch
from reasonrl.types import Group, Problem, TrainBatch

GreedyRewards = Callable[[Sequence[Problem]], Sequence[float]]


@dataclass
class AdvantageEstimation:
    """Builds each step's TrainBatch with the advantages of `estimator`."""

    estimator: Callable[..., torch.Tensor]
    learner: Learner
    micro_batch_size: int
    knobs: Mapping[str, Any]  # values by name; the estimator gets those it declares (reasonrl.spec)
    kl_estimator: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    kl_in_reward: bool = False
    ref_model: Any = None
    critic: Critic | None = None
    greedy_rewards: GreedyRewards | None = None
    mask_truncated: bool = False  # DAPO's overlong filtering: cut-off completions get no loss
    reward_weights: Mapping[str, float] = field(default_factory=dict)  # component name -> weight
    returns_knobs: Mapping[str, float] = field(default_factory=dict)  # gamma, lam of the critic's targets

    @property
    def inputs(self) -> frozenset[str]:
        return spec_of(self.estimator).inputs

    def __call__(self, groups: Sequence[Group], pad_id: int, kl_coef: float) -> tuple[TrainBatch, dict[str, float]]:
        """The batch of `groups` with advantages (and log-probs or critic targets when needed);
        metrics of the estimation (the KL when it is in the reward)."""
        batch = make_train_batch(groups, [0.0] * sum(g.size for g in groups), pad_id)
        mask_NT = batch.loss_mask_NT
        rewards_N = torch.tensor([r for group in groups for r in group.rewards], dtype=torch.float32)
        metrics: dict[str, float] = {}
        kl_NT = None
        if self.kl_in_reward and kl_coef > 0:
            batch, kl_NT = self._kl_to_reference(batch)
            kl_NT = kl_NT * mask_NT
            metrics["kl/mean"] = masked_mean(kl_NT, mask_NT).item()
        knobs = self._declared_knobs()
        if is_tree_level(self.estimator):
            if kl_NT is not None:
                raise ValueError(f"the advantage estimator {self.estimator.__name__!r} credits tree segments from "
                                 "outcome rewards; put the KL in the loss: algo.kl_in=loss")
            advantages_NT = _tree_advantages(self.estimator, groups, rewards_N, mask_NT)
        elif is_token_level(self.estimator):
            if groups[0].token_rewards is None:
                rewards_NT = token_rewards(rewards_N, mask_NT, kl_NT, kl_coef)
            else:  # a process reward: step scores on their steps' last tokens
                rewards_NT = _dense_token_rewards(groups, mask_NT)
                if kl_NT is not None:
                    rewards_NT = rewards_NT - kl_coef * kl_NT * mask_NT
            if "values_NT" in self.inputs:
                batch, knobs = self._with_critic_targets(batch, rewards_NT, knobs)
            advantages_NT = self.estimator(rewards_NT, mask_NT, **knobs)
        else:
            if kl_NT is not None:
                if "components_KBG" in self.inputs:
                    raise ValueError(f"the advantage estimator {self.estimator.__name__!r} reads the reward's "
                                     "components, not the total the KL penalty is taken from: use algo.kl_in=loss")
                rewards_N = rewards_N - kl_coef * kl_NT.sum(dim=1)
            advantages_N = torch.empty_like(rewards_N)
            for rows_BG, members in _same_size_groups(groups):
                advantages_N[rows_BG] = self.estimator(rewards_N[rows_BG], **knobs, **self._group_inputs(members))
            advantages_NT = advantages_N[:, None] * mask_NT
        batch = replace(batch, advantages_NT=advantages_NT.float() * mask_NT)
        if self.mask_truncated:
            # After the advantages: a truncated completion still counts in its group's baseline.
            batch, metrics["sampling/masked_truncated"] = without_cut_off(batch, groups)
        return batch, metrics

    def _declared_knobs(self) -> dict[str, Any]:
        """The knobs and context values the estimator declares, from `knobs` (which may hold more)."""
        spec = spec_of(self.estimator)
        names = (*spec.knobs, *spec.context)
        if missing := [name for name in names if name not in self.knobs]:
            raise ValueError(f"the advantage estimator {self.estimator.__name__!r} declares {missing}, which are not "
                             "among the estimation's knobs")
        return {name: self.knobs[name] for name in names}

    def _kl_to_reference(self, batch: TrainBatch) -> tuple[TrainBatch, torch.Tensor]:
        """The batch with the reference's log-probs, and the per-token KL estimate of the policy to
        the reference, (N, T-1). The policy's log-probs are not kept as the update's old
        log-probs: the learner computes those in the micro-batches of its optimizer steps, where
        they match the update's bit for bit."""
        if self.ref_model is None:
            raise ValueError("a KL penalty in the reward needs the reference model")
        ref_logp_NT = self.learner.logprobs(self.ref_model, batch, self.micro_batch_size)
        kl_NT = self.kl_estimator(self.learner.logprobs(self.learner.model, batch, self.micro_batch_size), ref_logp_NT)
        return replace(batch, ref_logp_NT=ref_logp_NT), kl_NT

    def _with_critic_targets(self, batch: TrainBatch, rewards_NT: torch.Tensor, knobs: dict[str, Any],
                             ) -> tuple[TrainBatch, dict[str, Any]]:
        if self.critic is None:
            raise ValueError(f"the advantage estimator {self.estimator.__name__!r} needs a critic")
        values_NT = self.critic.values(batch, self.micro_batch_size)
        returns_NT = lambda_returns(rewards_NT, batch.loss_mask_NT, values_NT=values_NT, **self.returns_knobs)
        return replace(batch, old_values_NT=values_NT, returns_NT=returns_NT), knobs | {"values_NT": values_NT}

    def _group_inputs(self, groups: Sequence[Group]) -> dict[str, torch.Tensor]:
        inputs = {}
        if "lengths_BG" in self.inputs:
            inputs["lengths_BG"] = torch.tensor([[len(c.token_ids) for c in group.completions] for group in groups])
        if "greedy_rewards_B" in self.inputs:
            if self.greedy_rewards is None:
                raise ValueError(f"the advantage estimator {self.estimator.__name__!r} needs greedy completions")
            inputs["greedy_rewards_B"] = torch.tensor(list(self.greedy_rewards([g.problem for g in groups])),
                                                      dtype=torch.float32)
        if "components_KBG" in self.inputs:
            inputs |= self._components(groups)
        return inputs

    def _components(self, groups: Sequence[Group]) -> dict[str, torch.Tensor]:
        """Each weighted reward component's values over `groups`, (K, B, G), and its weight, (K,)."""
        name = self.estimator.__name__
        if not self.reward_weights:
            raise ValueError(f"the advantage estimator {name!r} needs the reward's components and their weights")
        missing = [c for c in self.reward_weights if any(c not in g.reward_components for g in groups)]
        if missing:
            raise ValueError(f"the advantage estimator {name!r} needs every group's value of the reward components "
                             f"{', '.join(missing)}")
        try:
            values = torch.tensor([[list(g.reward_components[c]) for g in groups] for c in self.reward_weights],
                                  dtype=torch.float32)
        except (TypeError, ValueError) as exc:  # ragged: a token-level component holds a value per token
            raise ValueError(f"the advantage estimator {name!r} normalises outcome rewards; a token-level reward "
                             "component (a process reward) has no single value per completion") from exc
        return {"components_KBG": values, "weights_K": torch.tensor(list(self.reward_weights.values()))}


def without_cut_off(batch: TrainBatch, groups: Sequence[Group]) -> tuple[TrainBatch, float]:
    """DAPO's overlong filtering: `batch` (of `groups`' completions, in order) with the completions that
    hit the length limit left without loss tokens or advantages, and how many they were."""
    truncated_N = torch.tensor([c.finish_reason == "length" for g in groups for c in g.completions])
    mask_NT = batch.loss_mask_NT * ~truncated_N[:, None]
    return replace(batch, loss_mask_NT=mask_NT, advantages_NT=batch.advantages_NT * mask_NT), float(truncated_N.sum())


def _tree_advantages(estimator: Callable[..., torch.Tensor], groups: Sequence[Group], rewards_N: torch.Tensor,
                     mask_NT: torch.Tensor) -> torch.Tensor:
    """A tree estimator's node advantages laid on the tokens of each node, in every completion
    through it, (N, T). A group sampled flat is the tree of one node per completion."""
    per_token: list[float] = []
    start = 0
    for group in groups:
        if any(c.loss_mask is not None for c in group.completions):
            raise ValueError(f"the advantage estimator {estimator.__name__!r} credits tree segments of generated "
                             "tokens; multi-turn episodes (tokens inserted by an environment) have no tree")
        tree = group.tree or flat_tree([len(c.token_ids) for c in group.completions])
        advantages_S = estimator(rewards_N[start:start + group.size], under_SG=membership_SG(tree),
                                 parent_S=torch.tensor(tree.parents))
        start += group.size
        for g in range(group.size):
            per_token.extend(advantages_S[tree.node_of_tokens(g)].tolist())
    return _on_loss_positions(per_token, mask_NT)


def _dense_token_rewards(groups: Sequence[Group], mask_NT: torch.Tensor) -> torch.Tensor:
    """Every group's per-token rewards laid on the batch's completion positions, (N, T); the rewards of
    tokens an environment inserted (outside the loss mask) are not the policy's and are dropped."""
    flat = [value for group in groups for completion, per_token in zip(group.completions, group.token_rewards)
            for value, generated in zip(per_token, completion.loss_mask or (1,) * len(per_token)) if generated]
    return _on_loss_positions(flat, mask_NT)


def _on_loss_positions(values: Sequence[float], mask_NT: torch.Tensor) -> torch.Tensor:
    """One value per completion token the policy generated, in batch order, laid on the batch's
    loss positions; zero elsewhere, (N, T)."""
    out_NT = torch.zeros_like(mask_NT, dtype=torch.float32)
    out_NT[mask_NT.bool()] = torch.tensor(values, dtype=torch.float32)
    return out_NT


def _same_size_groups(groups: Sequence[Group]) -> list[tuple[torch.Tensor, list[Group]]]:
    """The groups bucketed by size: for each size, the (B, G) row indices of their completions in
    the flat batch, and the groups. Group estimators see one rectangular batch per size (groups of
    different sizes come from an adaptive sampling budget)."""
    offsets, start = [], 0
    for group in groups:
        offsets.append(start)
        start += group.size
    buckets: dict[int, list[int]] = {}
    for index, group in enumerate(groups):
        buckets.setdefault(group.size, []).append(index)
    return [(torch.tensor([list(range(offsets[i], offsets[i] + size)) for i in members]), [groups[i] for i in members])
            for size, members in buckets.items()]
