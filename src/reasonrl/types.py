"""The data that flows through the RL loop, as frozen dataclasses, and the seams between its parts.

Problem -> (engine) -> Group of Completions -> (rewards) -> scored Group -> (advantages,
learner) -> TrainBatch. The seams are small Protocols: a reward (`RewardFn`, `GroupReward`,
`TokenReward`), a rollout engine (`RolloutEngine`, `PrefixEngine`), a problem sampler (`Sampler`),
the step's advantage estimation (`Estimation`), the holder of the KL coefficient (`KLCoefficient`),
and a participant of the training step (`Participant`, with `PolicyUpdate`: docs/architecture.md).
Nothing here imports from the rest of the package (the learner's loss and the producer's rollouts
are named in annotations only).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch

if TYPE_CHECKING:
    from reasonrl.algo.loss import PolicyLoss
    from reasonrl.rollout.producer import Rollouts

Message = Mapping[str, str]
"""A chat message: {"role": "system" | "user" | "assistant", "content": str}."""

FinishReason = Literal["stop", "length"]

CORRECT = "correct"
"""The reward component that checks an answer against the gold one: its mean is reported as accuracy."""

FULL_CREDIT = 1.0 - 1e-9
"""A verifier's score (in [0, 1]) from which an answer solved its problem: full credit, less float
rounding (a mean of ten checks of 0.1 sums to 0.9999999999999999)."""


def is_solution(correct: float | None, reward: float | None) -> bool:
    """One completion's verdict from its "correct" component (full credit), or without that
    component (`correct` None) from its total reward (above 0); see `Group.solved`."""
    if correct is not None:
        return correct >= FULL_CREDIT
    return reward is not None and reward > 0


@dataclass(frozen=True)
class Problem:
    """One task instance.

    `prompt` is either plain text (sent as a single user message when the model has a chat
    template, or verbatim otherwise) or a list of chat messages. `answer` is the gold answer a
    verifier compares against; `metadata` holds anything else (difficulty, source, ...).
    """

    id: str
    prompt: str | Sequence[Message]
    answer: str
    metadata: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class SamplingParams:
    """How the engine samples. `n` completions are drawn per problem (the group size G)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    seed: int = 0
    # Decode past end-of-sequence tokens, to max_new_tokens (stop strings still end a row): for
    # measuring long generations with models that would stop early.
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Completion:
    """One sampled answer.

    `token_ids` are exactly the generated ids (never re-tokenised); `logprobs[i]` is the
    log-probability of `token_ids[i]` under the sampling distribution (logits / temperature,
    before top-p/top-k truncation), as the learner recomputes it. In a multi-turn episode the
    tokens also hold what the environment inserted between the model's turns: `loss_mask[i]` is
    1 where the policy generated token i and 0 where the environment did (None: all generated),
    and an inserted token's log-prob is 0. `policy_version` is the number of updates the
    sampling weights had seen, when a trainer generated it (None otherwise); a partial rollout,
    sampled across weight updates, gives the oldest, and `token_versions` the version of each token.
    """

    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    loss_mask: tuple[int, ...] | None = None
    policy_version: int | None = None
    token_versions: tuple[int, ...] | None = None


@dataclass(frozen=True)
class TreeShape:
    """How a group's completions share their beginnings when sampled as a tree (rollout.tree).

    The nodes are runs of generated tokens: node s continues node `parents[s]` (-1: it starts
    right after the prompt) and holds `sizes[s]` tokens. Completion g is the tokens of the nodes
    on its path `paths[g]`, from the first segment down to its leaf, in order; so a node's
    tokens are generated once and appear in every completion whose path crosses it.
    `segment_tokens`: the length it branched at (0: not recorded).
    """

    parents: tuple[int, ...]
    sizes: tuple[int, ...]
    paths: tuple[tuple[int, ...], ...]
    segment_tokens: int = 0

    def node_of_tokens(self, g: int) -> list[int]:
        """The node of each token of completion g."""
        return [node for node in self.paths[g] for _ in range(self.sizes[node])]


@dataclass(frozen=True)
class Group:
    """A problem with its G completions, and once scored, their rewards.

    `rewards[g]` is the total reward of completion g; `reward_components[name][g]` its
    sub-scores (e.g. "correct", "format") before weighting. `token_rewards[g]`, when a reward
    component is token-level (process rewards), holds one reward per token of completion g.
    `reward_error` says why the group could not be scored, when a failing verifier is set to
    skip its group instead of stopping the run. `reward_timeouts` counts the verifier checks stopped
    at their time bound while scoring it (each scored 0). `tree` says which tokens the completions
    share, when they were sampled as a tree (None: each was sampled on its own). `max_new_tokens`
    is the generation budget they were sampled under (the step's: rollout.max_new_tokens, or a
    stage's), which rewards that measure length against it and the loss read from here.
    `failures` says why each episode left out of the group failed, when the engine plays episodes
    that can fail (an agent that raised or timed out): its completions are those of the episodes
    that finished (None: the engine has no such episodes).
    """

    problem: Problem
    prompt_ids: tuple[int, ...]
    completions: tuple[Completion, ...]
    rewards: tuple[float, ...] | None = None
    reward_components: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    token_rewards: tuple[tuple[float, ...], ...] | None = None
    reward_error: str | None = None
    reward_timeouts: int = 0
    tree: TreeShape | None = None
    max_new_tokens: int | None = None
    failures: tuple[str, ...] | None = None

    @property
    def size(self) -> int:
        return len(self.completions)

    @property
    def outcomes(self) -> tuple[float, ...] | None:
        """Each completion's verdict: its "correct" component where the reward has one, else its
        total reward (None while unscored). Bonuses such as a format reward are not in it."""
        return self.reward_components.get(CORRECT, self.rewards)

    @property
    def solved(self) -> tuple[bool, ...] | None:
        """Whether each completion solved the problem: its "correct" component at full credit where
        the reward has one, else a total reward above 0 (None while unscored). Partial credit is not a
        solution: reasoning-gym gives len(gold) / len(answer) for a gold number inside a longer answer
        ("3 times" against 3), the unit-test reward the share of tests passed; pass@k, the DAPO filter,
        a problem's pass rate, replay and rejection sampling count solutions."""
        if CORRECT in self.reward_components:
            return tuple(is_solution(value, None) for value in self.reward_components[CORRECT])
        return None if self.rewards is None else tuple(is_solution(None, value) for value in self.rewards)

    @property
    def generated_tokens(self) -> int:
        """Tokens the engine generated for the group: a tree's shared segments count once."""
        if self.tree is not None:
            return sum(self.tree.sizes)
        return sum(len(c.token_ids) for c in self.completions)


@dataclass(frozen=True)
class TrainBatch:
    """N sequences (prompt + completion), right-padded to T tokens, ready for the learner.

    Position t of every `_NT` tensor refers to the token predicted at t, i.e. `input_ids_NT`
    shifted by one: `logp_NT[n, t] = log p(input_ids_NT[n, t + 1] | input_ids_NT[n, :t + 1])`.
    `loss_mask_NT` is 1 on completion tokens only; `advantages_NT` is the advantage of each
    completion token (a sequence-level advantage repeated over its tokens). The optional tensors
    are filled when the algorithm needs them: log-probs of the policy before the update
    (`old_logp_NT`) and of the reference (`ref_logp_NT`), and for a critic its regression
    targets (`returns_NT`) and its values before the update (`old_values_NT`); and the tokens an
    objective chose over the whole optimizer step (`selected_NT`, bool: Clip-Cov, KL-Cov).
    `max_new_tokens` is the generation budget the step's completions were sampled under (the
    largest, if groups of several budgets are trained together), for a loss normalised by it.
    """

    input_ids_NT: torch.Tensor
    attention_mask_NT: torch.Tensor
    loss_mask_NT: torch.Tensor
    sampling_logp_NT: torch.Tensor
    advantages_NT: torch.Tensor
    old_logp_NT: torch.Tensor | None = None
    ref_logp_NT: torch.Tensor | None = None
    returns_NT: torch.Tensor | None = None
    old_values_NT: torch.Tensor | None = None
    selected_NT: torch.Tensor | None = None
    max_new_tokens: int | None = None

    @property
    def num_sequences(self) -> int:
        return self.input_ids_NT.shape[0]

    def to(self, device: torch.device | str) -> TrainBatch:
        return TrainBatch(**{name: value.to(device) if isinstance(value := getattr(self, name), torch.Tensor) else value
                             for name in self.__dataclass_fields__})

    def select(self, index_N: torch.Tensor) -> TrainBatch:
        """The sub-batch of the sequences at `index_N`, trimmed to its longest sequence."""
        length = int(self.attention_mask_NT[index_N].sum(1).max())
        parts = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            width = length if name in ("input_ids_NT", "attention_mask_NT") else length - 1
            parts[name] = value[index_N, :width] if isinstance(value, torch.Tensor) else value
        return TrainBatch(**parts)


class RewardFn(Protocol):
    """A reward: the completion's text and its problem in, a float out.

    Unparseable answers score 0; a bug (an exception) is not a score and stops the run.
    """

    def __call__(self, completion: str, problem: Problem) -> float: ...


class GroupReward(Protocol):
    """A reward that scores a problem's completions together: it sees each `Completion` whole
    (token ids, finish reason, log-probs) and all of its group (e.g. a majority vote, a judge
    model called once per group, a length penalty). One finite score per completion, in order."""

    def score_group(self, problem: Problem, completions: Sequence[Completion]) -> Sequence[float]: ...


class TokenReward(Protocol):
    """A reward with a value per completion token (e.g. a process reward model's step scores,
    placed on each step's last token) besides its per-completion score (`score_group`).
    Token-level advantage estimators train on the token values; the others on the scores."""

    def score_group(self, problem: Problem, completions: Sequence[Completion]) -> Sequence[float]: ...

    def score_tokens(self, problem: Problem, completions: Sequence[Completion]) -> Sequence[Sequence[float]]:
        """For completion g, one value per token of `completions[g].token_ids`."""
        ...


class RolloutEngine(Protocol):
    """Turns problems into groups of sampled completions with the policy's current weights: all the
    loop uses of an engine (hf, vLLM, a served model, Ray workers, an agent playing episodes)."""

    tokenizer: Any
    pad_id: int

    def generate(self, problems: Sequence[Problem], sampling: SamplingParams) -> list[Group]:
        """`sampling.n` completions for every problem, in problem order."""
        ...

    def prompt_ids(self, problem: Problem) -> list[int]:
        """The token ids a problem's completions continue (its prompt, through the chat template)."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights with the learner's (names as in the HF state dict)."""
        ...

    def close(self) -> None:
        """Release what the engine holds (worker processes, Ray); the loop calls it once, at the end."""
        ...


class PrefixEngine(RolloutEngine, Protocol):
    """An engine that continues given token-id prefixes (trees of segments, beam search, episodes
    of several turns): `seeds`, one per prefix, make each continuation reproducible alone."""

    def continue_from(self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams,
                      seeds: Sequence[int] | None = None) -> list[list[Completion]]:
        """`sampling.n` continuations of each prefix, in prefix order."""
        ...


class Sampler(Protocol):
    """Chooses the training problems (sampling.problems, reasonrl.sampling): draws indices into the
    task's training problems, learns from their groups' accuracy, and keeps resumable state."""

    def next(self, count: int) -> list[int]: ...

    def observe(self, indices: Sequence[int], accuracies: Sequence[float]) -> None: ...

    def metrics(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Estimation(Protocol):
    """A step's scored groups -> the learner's batch (per-token advantages, and what the loss needs
    besides), with the estimation's metrics; `kl_coef` weighs a KL penalty in the reward. `critic`
    is the value model the advantages read (GAE's), if any."""

    @property
    def critic(self) -> Any: ...

    def __call__(self, groups: Sequence[Group], pad_id: int, kl_coef: float) -> tuple[TrainBatch, dict[str, float]]:
        ...


class Learner(Protocol):
    """The policy's trainable weights and their update, as the loop uses them: one process
    (reasonrl.training.learner.Learner) or data-parallel ranks elsewhere (distributed.ray.RayLearner).
    `model` is this process's copy of the policy (what the engine syncs from and checkpoints save);
    `optimizer_steps` the last update's metrics, one record per optimizer step."""

    model: Any
    optimizer_steps: list[dict[str, float]]

    def update(self, batch: TrainBatch, loss: PolicyLoss, *, epochs: int = 1, mini_batches: int = 1,
               micro_batch_size: int = 8, ref_model: Any = None, step: int = 0,
               auxiliary: tuple[TrainBatch, PolicyLoss] | None = None) -> dict[str, float]:
        """Optimise `loss` on `batch`; the update's metrics."""
        ...

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """The trainable weights, to sync to the rollout engine."""
        ...

    def logprobs(self, model: Any, batch: TrainBatch, micro_batch_size: int,
                 parts: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """No-grad log-probs of the batch under `model` (the policy or the reference), (N, T-1)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None:
        """Release what the learner holds elsewhere (Ray actors); the loop calls it once, at the end."""
        ...


class KLCoefficient(Protocol):
    """Holds the KL penalty's coefficient, which may change from step to step (an adaptive KL)."""

    @property
    def value(self) -> float: ...


@dataclass(frozen=True)
class PolicyUpdate:
    """What the policy's update optimises: `loss`, and an `auxiliary` (batch, loss) whose gradient
    joins every optimizer step (Learner.update)."""

    loss: PolicyLoss
    auxiliary: tuple[TrainBatch, PolicyLoss] | None = None


class Participant(Protocol):
    """A part of every training step (reasonrl.participants: when the loop calls each hook, and in
    which order); each hook defaults to doing nothing. `name` keys its state in checkpoints ("":
    no state)."""

    name: str = ""

    def observe(self, step: int, indices: Sequence[int], groups: list[Group]) -> list[Group]:
        return groups

    def contribute(self, step: int, update: PolicyUpdate) -> PolicyUpdate:
        return update

    def after_update(self, step: int, batch: TrainBatch, metrics: dict[str, float]) -> None:
        return None

    def after_sync(self, step: int) -> None:
        return None

    def metrics(self, step: int, rollouts: Rollouts) -> dict[str, float]:
        return {}

    def stop_reason(self, step: int) -> str:
        return ""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None
