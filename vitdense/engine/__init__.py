"""Training machinery shared by the dense and classification recipes."""
from .optim_constructor import LayerDecayOptimWrapperConstructor

__all__ = ['LayerDecayOptimWrapperConstructor']
