"""The seeded demo data sets behind the CPU-sized recipes, written in the real sets' layouts.

One interface for the four: ``make_demo_<set>(out_dir, num_train, num_val, size, seed, ...)``
writes the set under ``out_dir`` and returns it as a ``Path``; a set is a pure function of its
arguments. ``make_demo_coco`` / ``make_demo_ade`` (:mod:`.shapes`: shapes for Mask R-CNN and
UperNet / Semantic FPN) and ``make_demo_panoptic`` (:mod:`.panoptic`: the ADE scenes in the
COCO panoptic layout, for Mask2Former's panoptic head) count images; ``make_demo_imagenet``
(:mod:`.drawn_imagenet`: ten drawn classes for the ImageNet recipes) counts images per class.
Command line: ``tools/data/make_demo_data.py {coco,ade,panoptic,imagenet}``.
"""
import inspect
import os.path as osp
from pathlib import Path
from typing import Callable, Optional

from .drawn_imagenet import DEMO_IMAGENET_CLASSES, draw_demo_image, make_demo_imagenet
from .panoptic import PANOPTIC_CLASSES, make_demo_panoptic
from .shapes import ADE_CLASSES, SHAPE_CLASSES, make_demo_ade, make_demo_coco

#: the demo sets by name; each maker's default ``out_dir`` is the folder the demo configs read
DEMO_SET_MAKERS: dict[str, Callable[..., Path]] = {
    'coco': make_demo_coco, 'ade': make_demo_ade, 'panoptic': make_demo_panoptic,
    'imagenet': make_demo_imagenet}


def default_folder(kind: str) -> str:
    """The folder the demo configs read the demo set ``kind`` from."""
    return inspect.signature(DEMO_SET_MAKERS[kind]).parameters['out_dir'].default


def demo_set_at(data_root: Optional[str]) -> Optional[str]:
    """The demo set whose default folder ``data_root`` is (a demo config's), else None."""
    if not data_root:
        return None
    folder = osp.normpath(data_root)
    return next((kind for kind in DEMO_SET_MAKERS
                 if folder == default_folder(kind)
                 or folder.endswith(osp.sep + default_folder(kind))), None)


__all__ = ['ADE_CLASSES', 'DEMO_IMAGENET_CLASSES', 'DEMO_SET_MAKERS', 'PANOPTIC_CLASSES',
           'SHAPE_CLASSES', 'default_folder', 'demo_set_at', 'draw_demo_image', 'make_demo_ade',
           'make_demo_coco', 'make_demo_imagenet', 'make_demo_panoptic']
