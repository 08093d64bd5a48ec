from .base import ColumnarBackbone
from .cait import CaiT
from .convit import ConViT
from .vit import ViT
from .xcit import XCiT

__all__ = ['ColumnarBackbone', 'ViT', 'CaiT', 'XCiT', 'ConViT']
