"""Object detection and instance segmentation with mmdet: test-time augmentation that keeps
masks. Import it from a config with ``custom_imports=dict(imports=['vitdense', 'vitdense.det'])``
to register ``vitdense.InstanceTTAModel``.
"""
from .tta import InstanceTTAModel

__all__ = ['InstanceTTAModel']
