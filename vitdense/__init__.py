"""vitdense: columnar vision transformers (ViT, CaiT, XCiT, ConViT) as OpenMMLab backbones.

Importing the package applies the compatibility fixes for the host stack
(``vitdense.compat``) and registers the models in the ``vitdense`` scope, so
``custom_imports=dict(imports=['vitdense'])`` in a config is all a user needs.
"""
from . import compat  # noqa: F401  (applies the host-stack fixes first)
from .registry import MODELS  # noqa: F401
from .version import __version__
from . import models  # noqa: F401,E402

__all__ = ['__version__', 'MODELS']
