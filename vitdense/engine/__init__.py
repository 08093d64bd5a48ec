"""Training machinery shared by the dense and classification recipes."""
from .optim_constructor import LayerDecayOptimWrapperConstructor
from .time_budget import TimeBudgetHook, train_on_time_budget

__all__ = ['LayerDecayOptimWrapperConstructor', 'TimeBudgetHook', 'train_on_time_budget']
