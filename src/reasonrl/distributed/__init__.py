"""Scale-out: data-parallel learners over torch.distributed (data_parallel.py) and rollout
workers as Ray actors (ray.py, the only module importing ray; import it explicitly)."""

from reasonrl.distributed.data_parallel import DataParallelLearner, broadcast_batch, init_from_env

__all__ = ["DataParallelLearner", "broadcast_batch", "init_from_env"]
