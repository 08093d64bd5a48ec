"""The seeded demo data sets behind the CPU-sized recipes, written in the real sets' layouts.

One interface for the three: ``make_demo_<set>(out_dir, num_train, num_val, size, seed, ...)``
writes the set under ``out_dir`` and returns it as a ``Path``; a set is a pure function of its
arguments. ``make_demo_coco`` / ``make_demo_ade`` (:mod:`.shapes`: shapes for Mask R-CNN and
UperNet / Semantic FPN) count images; ``make_demo_imagenet`` (:mod:`.drawn_imagenet`: ten
drawn classes for the ImageNet recipes) counts images per class. Command lines:
``tools/data/make_demo_data.py`` and ``tools/data/gen_demo_imagenet.py``.
"""
from .drawn_imagenet import DEMO_IMAGENET_CLASSES, draw_demo_image, make_demo_imagenet
from .shapes import ADE_CLASSES, SHAPE_CLASSES, make_demo_ade, make_demo_coco

__all__ = ['ADE_CLASSES', 'DEMO_IMAGENET_CLASSES', 'SHAPE_CLASSES', 'draw_demo_image',
           'make_demo_ade', 'make_demo_coco', 'make_demo_imagenet']
