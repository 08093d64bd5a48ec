"""The columnar backbone families, one file each, registered in ``vitdense.registry.MODELS``.

A new family is one file (its class registered with ``@MODELS.register_module()``) and its
import here; :func:`backbone_families` then finds it, in the order of these imports.
"""
from vitdense.registry import MODELS
from .base import ColumnarBackbone
from .checkpoint_adaptation import adapt_checkpoint
# registration order, which backbone_families() keeps: not alphabetical
from .vit import ViT  # isort: skip
from .cait import CaiT  # isort: skip
from .xcit import XCiT  # isort: skip
from .convit import ConViT  # isort: skip


def backbone_families() -> dict[str, type[ColumnarBackbone]]:
    """The columnar families of the registry by lower-case class name ('vit', 'cait',
    'xcit', 'convit'), in registration order."""
    return {name.lower(): module for name, module in MODELS.module_dict.items()
            if isinstance(module, type) and issubclass(module, ColumnarBackbone)}


__all__ = ['ColumnarBackbone', 'ViT', 'CaiT', 'XCiT', 'ConViT', 'backbone_families',
           'adapt_checkpoint']
