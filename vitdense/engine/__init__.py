"""Training machinery shared by the dense and classification recipes."""
from .optim_constructor import LayerDecayOptimWrapperConstructor
from .resume import ExactResumeHook, find_resumable_checkpoint
from .time_budget import TimeBudgetHook, train_on_time_budget

__all__ = ['ExactResumeHook', 'LayerDecayOptimWrapperConstructor', 'TimeBudgetHook',
           'find_resumable_checkpoint', 'train_on_time_budget']
