"""The hooks a vitdense run adds to mmengine's Runner: atomic checkpoints, exact resume, the
save on a preemption signal, the non-finite step guard, training on a time budget,
checkpoints of peft runs without their frozen base and EoMT's mask annealing."""
from .checkpoint import SafeCheckpointHook
from .eomt import EoMTMaskAnnealingHook
from .nonfinite import NonFiniteGuardHook, NonFiniteLossError
from .peft_checkpoint import PeftCheckpointHook
from .preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionHook
from .resume import ExactResumeHook
from .time_budget import TimeBudgetHook, TimeBudgetLogProcessor, train_on_time_budget

__all__ = ['EoMTMaskAnnealingHook', 'ExactResumeHook', 'NonFiniteGuardHook',
           'NonFiniteLossError', 'PREEMPTED_EXIT_CODE', 'PeftCheckpointHook', 'Preempted',
           'PreemptionHook', 'SafeCheckpointHook', 'TimeBudgetHook', 'TimeBudgetLogProcessor',
           'train_on_time_budget']
