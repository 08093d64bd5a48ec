"""Training machinery shared by the dense and classification recipes."""
from .optim_constructor import LayerDecayOptimWrapperConstructor
from .time_budget import TimeBudgetHook

__all__ = ['LayerDecayOptimWrapperConstructor', 'TimeBudgetHook']
