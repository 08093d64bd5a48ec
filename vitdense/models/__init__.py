"""vitdense models: the four columnar backbone families, their shared layers and the
simple feature pyramid neck,
ViT-Adapter's layout around any family, and EoMT's queries and mask module on a backbone."""
from .backbones import (CaiT, ColumnarBackbone, ConViT, ViT, XCiT, adapt_checkpoint,
                        backbone_families)
from .backbones.adapter import ColumnarAdapter
from .eomt import EoMT
from .necks import SimpleFeaturePyramid

__all__ = ['ColumnarBackbone', 'ViT', 'CaiT', 'XCiT', 'ConViT', 'backbone_families',
           'adapt_checkpoint', 'SimpleFeaturePyramid', 'ColumnarAdapter', 'EoMT']
