"""Optimisers and optimiser-wrapper constructors: layer-wise lr decay, LAMB over shards."""
from .lamb import ShardedLamb
from .layer_decay import LayerDecayOptimWrapperConstructor

__all__ = ['LayerDecayOptimWrapperConstructor', 'ShardedLamb']
