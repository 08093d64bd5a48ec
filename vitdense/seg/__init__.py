"""Semantic segmentation with mmseg: frozen-backbone probes and EoMT's head. Import it from a
config with ``custom_imports=dict(imports=['vitdense', 'vitdense.seg'])`` to register
``vitdense.FrozenBackboneSegmentor``, ``vitdense.LinearProbeHead`` and ``vitdense.EoMTHead``.
"""
from .eomt import EoMTHead
from .probe import FrozenBackboneSegmentor, LinearProbeHead

__all__ = ['EoMTHead', 'FrozenBackboneSegmentor', 'LinearProbeHead']
