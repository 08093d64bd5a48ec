"""Seeded synthetic datasets that make the dense recipes runnable on a CPU in minutes.

Two layouts of the same scenes (coloured circles, squares and triangles that may occlude
each other). By default an object's colour is a jittered shade of its class's colour (reds,
greens, blues; ``CLASS_COLOURS``), so classes differ in appearance as well as in shape, as
object classes do in real data; ``class_colours=False`` paints every object in any colour, and
then only shape tells the classes apart. (Measured with ResNet-18 Mask R-CNN, 7 CPU-minutes:
bbox mAP 0.55 with class colours, 0.11 with random ones: shape alone is not learnt in minutes.)

- :func:`make_demo_coco`: COCO instance segmentation (``annotations/instances_{train,val}.json``
  with compressed-RLE masks of the *visible* part of every object, ``{train,val}/*.jpg``).
- :func:`make_demo_ade`: the ADE20k folder layout (``images/{training,validation}/*.jpg``,
  ``annotations/{training,validation}/*.png``) with two textured "stuff" classes behind the
  shapes and label 0 reserved for clutter, as in ADE20k where 0 means "other" and is ignored
  (``reduce_zero_label=True``).

Every image draws from its own generator seeded by ``(seed, split, index)``, so a dataset is
a pure function of its arguments and the first ``n`` images do not depend on the total count.
Masks are rasterised without anti-aliasing and the image pixels are painted from the same
label map, so annotations are exact to the pixel.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import cv2
import numpy as np
from pycocotools import mask as mask_utils

SHAPE_CLASSES = ('circle', 'square', 'triangle')
#: Base colour of each shape class when colours follow the class (reds, greens, blues).
CLASS_COLOURS = np.array([(210., 50., 50.), (50., 180., 60.), (50., 80., 215.)])
ADE_CLASSES = ('wall', 'floor') + SHAPE_CLASSES
_SPLITS = {'train': 0, 'val': 1}


@dataclass
class Scene:
    """A rendered scene: the image and, per object, its class and visible mask."""

    image: np.ndarray  # (H, W, 3) uint8, RGB
    labels: list[int]  # index into SHAPE_CLASSES
    masks: list[np.ndarray]  # (H, W) bool, visible part only


def _shape_mask(rng: np.random.Generator, size: int, kind: int) -> np.ndarray:
    """Rasterise one randomly placed, sized and rotated shape of class ``kind``."""
    radius = rng.uniform(0.08, 0.22) * size
    centre = rng.uniform(0.12 * size, 0.88 * size, 2)
    mask = np.zeros((size, size), np.uint8)
    if kind == 0:
        cv2.circle(mask, tuple(int(round(c)) for c in centre), int(round(radius)), 1, -1,
                   lineType=cv2.LINE_8)
    else:
        corners = 4 if kind == 1 else 3
        angles = rng.uniform(0, 2 * np.pi) + np.arange(corners) * 2 * np.pi / corners
        circumradius = radius * (1.25 if kind == 1 else 1.4)
        points = centre + circumradius * np.stack([np.cos(angles), np.sin(angles)], 1)
        cv2.fillPoly(mask, [np.round(points).astype(np.int32)], 1, lineType=cv2.LINE_8)
    return mask.astype(bool)


def _layout(rng: np.random.Generator, size: int, max_objects: int,
            min_visible: float = 0.5, min_pixels: int = 40) -> tuple[np.ndarray, list[int]]:
    """Stack 1..max_objects shapes back to front; each keeps >= ``min_visible`` of its area.

    Returns the label map (index of the top object per pixel, -1 for background) and the
    class of each object. A candidate that would hide too much of itself or of an earlier
    object is redrawn, so heavy but not total occlusions occur.
    """
    target = int(rng.integers(1, max_objects + 1))
    canvas = np.full((size, size), -1, np.int64)
    kinds: list[int] = []
    areas: list[int] = []
    for _ in range(50 * max_objects):
        if len(kinds) == target:
            break
        kind = int(rng.integers(len(SHAPE_CLASSES)))
        mask = _shape_mask(rng, size, kind)
        trial = canvas.copy()
        trial[mask] = len(kinds)
        visible = np.bincount(trial[trial >= 0], minlength=len(kinds) + 1)
        full = np.array(areas + [int(mask.sum())])
        if np.all(visible >= np.maximum(min_visible * full, min_pixels)):
            canvas, kinds, areas = trial, kinds + [kind], areas + [int(mask.sum())]
    return canvas, kinds


def _distinct_colour(rng: np.random.Generator, avoid: list[np.ndarray],
                     min_distance: float = 70.0) -> np.ndarray:
    """A random RGB colour at least ``min_distance`` away from every colour in ``avoid``."""
    for _ in range(100):
        colour = rng.uniform(0, 255, 3)
        if all(np.linalg.norm(colour - other) >= min_distance for other in avoid):
            return colour
    return colour


def _gradient(rng: np.random.Generator, size: int, amplitude: float) -> np.ndarray:
    """A linear brightness ramp in a random direction, (H, W, 1)."""
    yy, xx = np.mgrid[0:size, 0:size] / size - 0.5
    angle = rng.uniform(0, 2 * np.pi)
    return (amplitude * (np.cos(angle) * xx + np.sin(angle) * yy))[..., None]


def _object_colour(rng: np.random.Generator, kind: int, by_class: bool,
                   avoid: list[np.ndarray], jitter: float = 40.0) -> np.ndarray:
    """An object's colour: its class's base colour jittered, or any colour apart from
    ``avoid`` (the background and the objects already drawn)."""
    if by_class:
        return np.clip(CLASS_COLOURS[kind] + rng.uniform(-jitter, jitter, 3), 0, 255)
    return _distinct_colour(rng, avoid)


def _finish(rng: np.random.Generator, image: np.ndarray, noise: float = 6.0) -> np.ndarray:
    """Add pixel noise and convert to uint8."""
    image = image + rng.normal(0, noise, image.shape)
    return np.clip(np.round(image), 0, 255).astype(np.uint8)


def render_shapes(rng: np.random.Generator, size: int = 160, max_objects: int = 4,
                  class_colours: bool = True) -> Scene:
    """One COCO-style scene: shapes over a shaded plain background, in random colours or,
    with ``class_colours``, in jittered shades of their class's colour."""
    canvas, kinds = _layout(rng, size, max_objects)
    background = _distinct_colour(rng, list(CLASS_COLOURS) if class_colours else [])
    colours = [background]
    for kind in kinds:
        colours.append(_object_colour(rng, kind, class_colours, colours))
    image = np.empty((size, size, 3))
    image[:] = background
    image += _gradient(rng, size, 60.0)
    for index, colour in enumerate(colours[1:]):
        image[canvas == index] = colour
    masks = [canvas == index for index in range(len(kinds))]
    return Scene(_finish(rng, image), kinds, masks)


def _texture(rng: np.random.Generator, size: int, striped: bool) -> np.ndarray:
    """A (H, W, 3) texture: two-colour stripes (wall) or a two-colour checkerboard (floor)."""
    first = _distinct_colour(rng, [])
    second = _distinct_colour(rng, [first], 50.0)
    yy, xx = np.mgrid[0:size, 0:size]
    period = rng.uniform(6, 16)
    if striped:
        angle = rng.uniform(0, np.pi)
        phase = (np.cos(angle) * xx + np.sin(angle) * yy) // (period / 2)
    else:
        phase = xx // (period / 2) + yy // (period / 2)
    return np.where((phase % 2 == 0)[..., None], first, second)


def render_semantic(rng: np.random.Generator, size: int = 128, max_objects: int = 4,
                    class_colours: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """One ADE-style scene: (RGB image, label map) with ADE ids (0 clutter, 1.. classes).

    A random straight boundary splits the background into a striped "wall" and a checkered
    "floor" (sometimes only one of them); shapes (ids 3..5) go on top, then 0-2 short
    scribbles of clutter labelled 0, which training and evaluation ignore.
    """
    image, label, _ = render_scene(rng, size, max_objects, class_colours)
    return image, label


def render_scene(rng: np.random.Generator, size: int = 128, max_objects: int = 4,
                 class_colours: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The scene of :func:`render_semantic` with its objects apart: (RGB image, ADE label
    map, index of the object on top per pixel or -1). Clutter relabels pixels to 0 in the
    label map only, so the label map says which object pixels are visible."""
    yy, xx = np.mgrid[0:size, 0:size]
    angle = rng.uniform(0, 2 * np.pi)
    offset = rng.uniform(-0.7, 0.7) * size / 2
    is_wall = (np.cos(angle) * (xx - size / 2) + np.sin(angle) * (yy - size / 2)) < offset
    label = np.where(is_wall, 1, 2).astype(np.uint8)
    image = np.where(is_wall[..., None], _texture(rng, size, True), _texture(rng, size, False))
    image = image + _gradient(rng, size, 40.0)
    canvas, kinds = _layout(rng, size, max_objects)
    for index, kind in enumerate(kinds):
        image[canvas == index] = _object_colour(rng, kind, class_colours, [])
        label[canvas == index] = 3 + kind
    for _ in range(int(rng.integers(0, 3))):
        points = rng.uniform(0, size, (3, 2)).round().astype(np.int32)
        clutter = np.zeros((size, size), np.uint8)
        cv2.polylines(clutter, [points], False, 1, int(rng.integers(2, 5)), lineType=cv2.LINE_8)
        image[clutter > 0] = rng.uniform(0, 255, 3)
        label[clutter > 0] = 0
    return _finish(rng, image), label, canvas


def scene_rng(seed: int, split: str, index: int) -> np.random.Generator:
    """The generator of image ``index`` of ``split``: a set is a pure function of its seed."""
    return np.random.default_rng([seed, _SPLITS[split], index])


def write_jpg(path: Path, rgb: np.ndarray) -> None:
    cv2.imwrite(str(path), rgb[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 95])


def write_coco_layout(out_dir: str | Path, kind: str, categories: list[dict],
                      write_split: Callable[[Path, str, int], tuple[list[dict], list[dict]]],
                      num_train: int, num_val: int) -> Path:
    """The COCO layout the demo COCO sets share: ``write_split(out_dir, split, count)`` writes
    a split's files and returns its ``images`` and ``annotations`` entries, written with
    ``categories`` to ``annotations/<kind>_<split>.json``; return ``out_dir``."""
    out_dir = Path(out_dir)
    for split, count in (('train', num_train), ('val', num_val)):
        images, annotations = write_split(out_dir, split, count)
        ann_file = out_dir / 'annotations' / f'{kind}_{split}.json'
        ann_file.parent.mkdir(parents=True, exist_ok=True)
        ann_file.write_text(json.dumps(dict(images=images, annotations=annotations,
                                            categories=categories)))
    return out_dir


def _coco_split(out_dir: Path, split: str, count: int, size: int, seed: int,
                max_objects: int, class_colours: bool) -> tuple[list[dict], list[dict]]:
    """Write one split's images; return its COCO ``images`` and ``annotations``."""
    (out_dir / split).mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for index in range(count):
        scene = render_shapes(scene_rng(seed, split, index), size, max_objects, class_colours)
        file_name = f'{index:06d}.jpg'
        write_jpg(out_dir / split / file_name, scene.image)
        image_id = index + 1
        images.append(dict(id=image_id, file_name=file_name, width=size, height=size))
        for kind, mask in zip(scene.labels, scene.masks):
            rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
            annotations.append(dict(
                id=len(annotations) + 1, image_id=image_id, category_id=kind + 1, iscrowd=0,
                segmentation=dict(size=rle['size'], counts=rle['counts'].decode('ascii')),
                area=float(mask_utils.area(rle)),
                bbox=[float(v) for v in mask_utils.toBbox(rle)]))
    return images, annotations


def make_demo_coco(out_dir: str | Path = 'data/demo_coco', num_train: int = 400,
                   num_val: int = 100, size: int = 160, seed: int = 0,
                   max_objects: int = 4, class_colours: bool = True) -> Path:
    """Write the demo COCO instance-segmentation set under ``out_dir``; return ``out_dir``."""
    categories = [dict(id=i + 1, name=name, supercategory='shape')
                  for i, name in enumerate(SHAPE_CLASSES)]
    write_split = partial(_coco_split, size=size, seed=seed, max_objects=max_objects,
                          class_colours=class_colours)
    return write_coco_layout(out_dir, 'instances', categories, write_split, num_train, num_val)


def make_demo_ade(out_dir: str | Path = 'data/demo_ade', num_train: int = 400,
                  num_val: int = 100, size: int = 128, seed: int = 0,
                  max_objects: int = 4, class_colours: bool = True) -> Path:
    """Write the demo ADE20k-layout semantic segmentation set; return ``out_dir``."""
    out_dir = Path(out_dir)
    for split, folder, count in (('train', 'training', num_train),
                                 ('val', 'validation', num_val)):
        (out_dir / 'images' / folder).mkdir(parents=True, exist_ok=True)
        (out_dir / 'annotations' / folder).mkdir(parents=True, exist_ok=True)
        for index in range(count):
            image, label = render_semantic(scene_rng(seed, split, index), size, max_objects,
                                           class_colours)
            stem = f'ADE_{split}_{index + 1:08d}'
            write_jpg(out_dir / 'images' / folder / f'{stem}.jpg', image)
            cv2.imwrite(str(out_dir / 'annotations' / folder / f'{stem}.png'), label)
    return out_dir
