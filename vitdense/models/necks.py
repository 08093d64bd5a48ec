"""Modules for dense configs beside the backbones, registered in the ``vitdense`` scope:
ViTDet's simple feature pyramid as a neck (``neck=dict(type='vitdense.SimpleFeaturePyramid',
in_channels=..., ...)``), and the channel LayerNorm its heads use, for mmcv's
``build_norm_layer`` (``norm_cfg=dict(type='vitdense.LN2d')``)."""
from vitdense.registry import MODELS
from .layers.norm import LayerNorm2d
from .layers.simple_pyramid import SimpleFeaturePyramid

MODELS.register_module(module=SimpleFeaturePyramid)
MODELS.register_module(name='LN2d', module=LayerNorm2d)

__all__ = ['SimpleFeaturePyramid', 'LayerNorm2d']
