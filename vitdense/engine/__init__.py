"""Training machinery shared by the dense and classification recipes, laid out as mmengine's:
``hooks/`` (what a Runner calls during training), ``optim/`` (optimisers and their
constructors), ``wrappers/`` (model wrappers for several processes), and beside them the
launch of a tool's process (:mod:`~vitdense.engine.launch`), its command line and config
(:mod:`~vitdense.engine.tool_config`), the resume decision
(:mod:`~vitdense.engine.resume_choice`), the host tools' table (:mod:`~vitdense.engine.hosts`),
compilation and the data checks."""
from .compile import CompileHook, compile_model
from .hooks import (PREEMPTED_EXIT_CODE, EoMTMaskAnnealingHook, ExactResumeHook,
                    NonFiniteGuardHook, NonFiniteLossError, PeftCheckpointHook, Preempted,
                    PreemptionHook, SafeCheckpointHook, TimeBudgetHook, TimeBudgetLogProcessor,
                    train_on_time_budget)
from .optim import LayerDecayOptimWrapperConstructor, ShardedLamb
from .preflight import CheckedDataset, DataError, check_data
from .resume_choice import find_resumable_checkpoint
from .wrappers import CPUDistributedDataParallel, FullyShardedModel, ShardedRunner

__all__ = ['CPUDistributedDataParallel', 'CheckedDataset', 'CompileHook', 'DataError',
           'EoMTMaskAnnealingHook', 'ExactResumeHook', 'FullyShardedModel',
           'LayerDecayOptimWrapperConstructor', 'NonFiniteGuardHook', 'NonFiniteLossError',
           'PREEMPTED_EXIT_CODE', 'PeftCheckpointHook', 'Preempted', 'PreemptionHook',
           'SafeCheckpointHook', 'ShardedLamb', 'ShardedRunner',
           'TimeBudgetHook', 'TimeBudgetLogProcessor', 'check_data', 'compile_model',
           'find_resumable_checkpoint', 'train_on_time_budget']
