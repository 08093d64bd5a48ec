"""Training machinery shared by the dense and classification recipes."""
from .checkpoint_hook import SafeCheckpointHook
from .compile import CompileHook, compile_model
from .distributed import CPUDistributedDataParallel
from .fsdp import FullyShardedModel, ShardedRunner
from .lamb import ShardedLamb
from .nonfinite import NonFiniteGuardHook, NonFiniteLossError
from .optim_constructor import LayerDecayOptimWrapperConstructor
from .preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionHook
from .preflight import CheckedDataset, DataError, check_data
from .resume import ExactResumeHook, find_resumable_checkpoint
from .time_budget import TimeBudgetHook, TimeBudgetLogProcessor, train_on_time_budget

__all__ = ['CPUDistributedDataParallel', 'CheckedDataset', 'CompileHook', 'DataError',
           'ExactResumeHook', 'FullyShardedModel', 'LayerDecayOptimWrapperConstructor',
           'NonFiniteGuardHook', 'NonFiniteLossError', 'PREEMPTED_EXIT_CODE', 'Preempted',
           'PreemptionHook', 'SafeCheckpointHook', 'ShardedLamb', 'ShardedRunner',
           'TimeBudgetHook',
           'TimeBudgetLogProcessor', 'check_data', 'compile_model', 'find_resumable_checkpoint',
           'train_on_time_budget']
