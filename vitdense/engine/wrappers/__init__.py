"""Model wrappers for training over several processes: DDP without GPUs, fully sharded."""
from .distributed import CPUDistributedDataParallel
from .fsdp import FullyShardedModel, ShardedRunner

__all__ = ['CPUDistributedDataParallel', 'FullyShardedModel', 'ShardedRunner']
