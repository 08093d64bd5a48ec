"""Necks registered in the ``vitdense`` scope, for configs that pair them with a backbone:
``neck=dict(type='vitdense.SimpleFeaturePyramid', in_channels=..., ...)``."""
from vitdense.registry import MODELS
from .layers.simple_pyramid import SimpleFeaturePyramid

MODELS.register_module(module=SimpleFeaturePyramid)

__all__ = ['SimpleFeaturePyramid']
