"""Which problems to train on: samplers with explicit, resumable state."""

from reasonrl.sampling.epochs import EpochSampler

__all__ = ["EpochSampler"]
