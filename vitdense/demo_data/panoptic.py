"""The demo panoptic set: the demo ADE scenes (:func:`.shapes.render_scene`) in the COCO
panoptic layout that mmdet's ``CocoPanopticDataset`` and ``CocoPanopticMetric`` read.

Things are the demo shapes (one segment per visible object), stuff the striped wall and the
checkered floor (one segment each where present); clutter scribbles are VOID (id 0), which
the metric ignores. Layout under ``out_dir``::

    {train,val}/000000.jpg                     images
    annotations/panoptic_{train,val}.json      images, annotations (segments_info), categories
    annotations/panoptic_{train,val}/000000.png  segment ids as RGB: id = R + 256 G + 256² B

Categories list the things first, as COCO panoptic and mmdet's heads (labels below
``num_things_classes`` are things) order them. Image ``i`` of a split is the scene of image
``i`` of the demo ADE set drawn at the same size and seed.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import cv2
import numpy as np

from .shapes import (ADE_CLASSES, CLASS_COLOURS, SHAPE_CLASSES, render_scene, scene_rng,
                     write_coco_layout, write_jpg)

STUFF_CLASSES = ('wall', 'floor')
#: things (the demo shapes) then stuff; category id = index + 1
PANOPTIC_CLASSES = SHAPE_CLASSES + STUFF_CLASSES
#: colours of the categories (the metric's and the visualiser's palette)
PANOPTIC_PALETTE = [tuple(int(c) for c in colour) for colour in CLASS_COLOURS] + [
    (180, 150, 100), (110, 110, 110)]
#: segment id = category id × SEGMENT_ID_STRIDE + the segment's number in its category
SEGMENT_ID_STRIDE = 1000


def _category_of_ade_label(label: int) -> int:
    """The panoptic category id of an ADE id of :func:`.shapes.render_semantic` (not 0)."""
    return PANOPTIC_CLASSES.index(ADE_CLASSES[label - 1]) + 1


def panoptic_segments(label: np.ndarray, objects: np.ndarray
                      ) -> tuple[np.ndarray, list[dict]]:
    """The segment-id map (0 VOID) and the ``segments_info`` of one scene, from its ADE label
    map and its per-pixel object index (:func:`.shapes.render_scene`)."""
    ids = np.zeros(label.shape, np.int64)
    segments = []
    counts = dict.fromkeys(range(1, len(PANOPTIC_CLASSES) + 1), 0)
    regions = [label == ade for ade in (1, 2)]
    regions += [(objects == index) & (label >= 3) for index in range(int(objects.max()) + 1)]
    for region in regions:
        if not region.any():
            continue
        category = _category_of_ade_label(int(label[region][0]))
        counts[category] += 1
        segment_id = category * SEGMENT_ID_STRIDE + counts[category]
        ids[region] = segment_id
        ys, xs = np.nonzero(region)
        segments.append(dict(
            id=segment_id, category_id=category, iscrowd=0, area=int(region.sum()),
            bbox=[float(xs.min()), float(ys.min()), float(xs.max() - xs.min() + 1),
                  float(ys.max() - ys.min() + 1)]))
    return ids, segments


def id_to_rgb(ids: np.ndarray) -> np.ndarray:
    """COCO panoptic's PNG encoding of a segment-id map: (H, W, 3) uint8 RGB."""
    return np.stack([(ids >> shift) & 255 for shift in (0, 8, 16)], -1).astype(np.uint8)


def _panoptic_split(out_dir: Path, split: str, count: int, size: int, seed: int,
                    max_objects: int, class_colours: bool) -> tuple[list[dict], list[dict]]:
    """Write one split's images and segment-id PNGs; return its COCO panoptic ``images`` and
    ``annotations``."""
    png_dir = out_dir / 'annotations' / f'panoptic_{split}'
    png_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / split).mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for index in range(count):
        image, label, objects = render_scene(scene_rng(seed, split, index), size, max_objects,
                                             class_colours)
        ids, segments = panoptic_segments(label, objects)
        stem = f'{index:06d}'
        write_jpg(out_dir / split / f'{stem}.jpg', image)
        cv2.imwrite(str(png_dir / f'{stem}.png'), id_to_rgb(ids)[..., ::-1])
        images.append(dict(id=index + 1, file_name=f'{stem}.jpg', width=size, height=size))
        annotations.append(dict(image_id=index + 1, file_name=f'{stem}.png',
                                segments_info=segments))
    return images, annotations


def make_demo_panoptic(out_dir: str | Path = 'data/demo_coco_panoptic', num_train: int = 400,
                       num_val: int = 100, size: int = 128, seed: int = 0,
                       max_objects: int = 4, class_colours: bool = True) -> Path:
    """Write the demo COCO panoptic set under ``out_dir``; return ``out_dir``."""
    categories = [dict(id=i + 1, name=name, supercategory='shape' if i < len(SHAPE_CLASSES)
                       else 'background', isthing=int(i < len(SHAPE_CLASSES)),
                       color=list(PANOPTIC_PALETTE[i]))
                  for i, name in enumerate(PANOPTIC_CLASSES)]
    write_split = partial(_panoptic_split, size=size, seed=seed, max_objects=max_objects,
                          class_colours=class_colours)
    return write_coco_layout(out_dir, 'panoptic', categories, write_split, num_train, num_val)
