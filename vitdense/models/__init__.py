"""vitdense models: the four columnar backbone families and their shared layers."""
from .backbones import CaiT, ColumnarBackbone, ConViT, ViT, XCiT, backbone_families

__all__ = ['ColumnarBackbone', 'ViT', 'CaiT', 'XCiT', 'ConViT', 'backbone_families']
