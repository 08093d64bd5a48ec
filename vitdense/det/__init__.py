"""Object detection and instance segmentation with mmdet: test-time augmentation that keeps
masks, and EoMT's head. Import it from a config with ``custom_imports=dict(imports=['vitdense',
'vitdense.det'])`` to register ``vitdense.InstanceTTAModel`` and ``vitdense.EoMTDetHead``.
"""
from .eomt import EoMTDetHead
from .tta import InstanceTTAModel

__all__ = ['EoMTDetHead', 'InstanceTTAModel']
