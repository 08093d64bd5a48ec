"""vitdense: columnar vision transformers (ViT, CaiT, XCiT, ConViT) as OpenMMLab backbones.

Importing the package registers the models in the ``vitdense`` scope, so
``custom_imports=dict(imports=['vitdense'])`` in a config is all a user needs; it changes
nothing in torch, mmengine, mmcv or the OpenMMLab libraries (``vitdense.compat`` lists the
fixes that are applied on request).
"""
from .registry import MODELS  # noqa: F401
from .version import __version__
from . import models  # noqa: F401,E402

__all__ = ['__version__', 'MODELS']
