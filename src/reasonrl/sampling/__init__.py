"""Which problems to train on, and which groups to keep: samplers with explicit, resumable state
(`types.Sampler`: `next(count)`, `observe(indices, accuracies)`, `metrics()`, `state_dict()`; by
name in `SAMPLERS`, reasonrl.sampling.samplers), and DAPO's dynamic
sampling (`fill_batch`), an adaptive number of samples per problem (`allocate_samples`), and
replay of correct completions into all-wrong groups (`ReplayBuffer`)."""

from reasonrl.sampling.budget import allocate_samples, generate_with_budget
from reasonrl.sampling.difficulty import (
    BandSampler,
    CompetenceCurriculum,
    PassRateCurriculum,
    PassRates,
    competence,
    group_accuracy,
)
from reasonrl.sampling.dynamic import DYNAMIC_KEEP, fill_batch, has_correctness_spread, has_reward_spread
from reasonrl.sampling.epochs import EpochSampler
from reasonrl.sampling.replay import ReplayBuffer
from reasonrl.sampling.samplers import SAMPLERS

__all__ = ["DYNAMIC_KEEP", "SAMPLERS", "BandSampler", "CompetenceCurriculum", "EpochSampler", "PassRateCurriculum", "PassRates",
           "ReplayBuffer", "allocate_samples", "competence", "fill_batch", "generate_with_budget", "group_accuracy",
           "has_correctness_spread", "has_reward_spread"]
