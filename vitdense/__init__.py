"""vitdense: columnar vision transformers (ViT, CaiT, XCiT, ConViT) as OpenMMLab backbones.

Importing the package registers the models in the ``vitdense`` scope, so
``custom_imports=dict(imports=['vitdense'])`` in a config is all a user needs. It adds, and
replaces nothing of torch, mmengine, mmcv or the OpenMMLab libraries: the ``vitdense``
registry scope and the ``vitdense::`` operators of the talking-heads kernels
(``torch.library``; the Triton one on first use). ``vitdense.compat`` lists the fixes that
are applied on request.
"""
from .registry import MODELS  # noqa: F401
from .version import __version__
from . import models  # noqa: F401,E402

__all__ = ['__version__', 'MODELS']
