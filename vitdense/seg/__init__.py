"""Semantic segmentation with mmseg: frozen-backbone probes. Import it from a config with
``custom_imports=dict(imports=['vitdense', 'vitdense.seg'])`` to register
``vitdense.FrozenBackboneSegmentor`` and ``vitdense.LinearProbeHead``.
"""
from .probe import FrozenBackboneSegmentor, LinearProbeHead

__all__ = ['FrozenBackboneSegmentor', 'LinearProbeHead']
