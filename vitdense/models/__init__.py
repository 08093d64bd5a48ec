"""vitdense models: the four columnar backbone families, their shared layers and the
simple feature pyramid neck."""
from .backbones import CaiT, ColumnarBackbone, ConViT, ViT, XCiT, backbone_families
from .necks import SimpleFeaturePyramid

__all__ = ['ColumnarBackbone', 'ViT', 'CaiT', 'XCiT', 'ConViT', 'backbone_families',
           'SimpleFeaturePyramid']
