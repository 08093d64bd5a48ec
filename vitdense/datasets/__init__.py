"""Dataset helpers: the seeded demo sets behind the CPU-sized dense recipes."""
from .demo import ADE_CLASSES, SHAPE_CLASSES, make_demo_ade, make_demo_coco

__all__ = ['ADE_CLASSES', 'SHAPE_CLASSES', 'make_demo_ade', 'make_demo_coco']
