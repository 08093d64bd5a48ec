"""A small, seeded, procedurally drawn stand-in for ImageNet with the same on-disk layout.

Ten classes of drawn shapes and textures (random colours, placement, size, rotation and pixel
noise) written as ``train/<class>/<class>_<i>.JPEG`` and ``val/<class>_val_<i>.JPEG`` with
``meta/{train,val}.txt`` annotation files, exactly what mmpretrain's ``ImageNet`` dataset reads,
so the ImageNet recipes run end to end on a 2-core machine without the real data.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image, ImageDraw

DEMO_IMAGENET_CLASSES: tuple[str, ...] = (
    'circle', 'square', 'triangle', 'cross', 'ring', 'star', 'hstripes', 'vstripes',
    'checkerboard', 'dots')
_SPLIT_IDS = {'train': 0, 'val': 1}

Colour = tuple[int, int, int]
Painter = Callable[[ImageDraw.ImageDraw, np.random.Generator, int, Colour], None]


def _rotated(points: np.ndarray, angle: float, centre: np.ndarray) -> list[tuple[float, float]]:
    """Rotate (N, 2) points by ``angle`` radians about ``centre``."""
    c, s = math.cos(angle), math.sin(angle)
    rot = np.array([[c, -s], [s, c]])
    return [tuple(p) for p in (points - centre) @ rot.T + centre]


def _shape_frame(rng: np.random.Generator, size: int) -> tuple[np.ndarray, float, float]:
    """Random centre, radius and rotation of a single foreground shape."""
    radius = rng.uniform(0.22, 0.38) * size
    centre = rng.uniform(radius, size - radius, size=2)
    return centre, radius, rng.uniform(0, 2 * math.pi)


def _polygon(corners: int, inner: float | None = None) -> Painter:
    """A regular polygon (or a star when ``inner`` sets the inner radius ratio)."""
    def paint(draw: ImageDraw.ImageDraw, rng: np.random.Generator, size: int,
              fg: Colour) -> None:
        centre, radius, angle = _shape_frame(rng, size)
        steps = corners * (2 if inner else 1)
        radii = [radius * (inner if inner and k % 2 else 1.0) for k in range(steps)]
        pts = np.array([[centre[0] + r * math.cos(2 * math.pi * k / steps),
                         centre[1] + r * math.sin(2 * math.pi * k / steps)]
                        for k, r in enumerate(radii)])
        draw.polygon(_rotated(pts, angle, centre), fill=fg)
    return paint


def _circle(draw: ImageDraw.ImageDraw, rng: np.random.Generator, size: int, fg: Colour) -> None:
    (x, y), r, _ = _shape_frame(rng, size)
    draw.ellipse([x - r, y - r, x + r, y + r], fill=fg)


def _ring(draw: ImageDraw.ImageDraw, rng: np.random.Generator, size: int, fg: Colour) -> None:
    (x, y), r, _ = _shape_frame(rng, size)
    draw.ellipse([x - r, y - r, x + r, y + r], outline=fg, width=max(2, int(r * 0.3)))


def _cross(draw: ImageDraw.ImageDraw, rng: np.random.Generator, size: int, fg: Colour) -> None:
    centre, r, angle = _shape_frame(rng, size)
    w = r * rng.uniform(0.25, 0.4)
    for arm in (np.array([[-r, -w], [r, -w], [r, w], [-r, w]]),
                np.array([[-w, -r], [w, -r], [w, r], [-w, r]])):
        draw.polygon(_rotated(arm + centre, angle, centre), fill=fg)


def _stripes(vertical: bool) -> Painter:
    """Parallel bars across the image, tilted by at most 20 degrees."""
    def paint(draw: ImageDraw.ImageDraw, rng: np.random.Generator, size: int,
              fg: Colour) -> None:
        period = rng.uniform(0.12, 0.25) * size
        angle = rng.uniform(-0.35, 0.35) + (math.pi / 2 if vertical else 0.0)
        centre = np.array([size / 2, size / 2])
        offset = rng.uniform(0, period)
        for k in range(-int(size / period) - 2, int(size / period) + 2):
            y0 = k * period + offset
            bar = np.array([[-size, y0], [2 * size, y0], [2 * size, y0 + period / 2],
                            [-size, y0 + period / 2]])
            draw.polygon(_rotated(bar, angle, centre), fill=fg)
    return paint


def _checkerboard(draw: ImageDraw.ImageDraw, rng: np.random.Generator, size: int,
                  fg: Colour) -> None:
    cell = rng.uniform(0.12, 0.22) * size
    angle = rng.uniform(0, math.pi / 2)
    centre = np.array([size / 2, size / 2])
    n = int(size / cell) + 3
    for i in range(-n, n):
        for j in range(-n, n):
            if (i + j) % 2:
                sq = np.array([[0, 0], [cell, 0], [cell, cell], [0, cell]]) + [i * cell, j * cell]
                draw.polygon(_rotated(sq + centre, angle, centre), fill=fg)


def _dots(draw: ImageDraw.ImageDraw, rng: np.random.Generator, size: int, fg: Colour) -> None:
    count = rng.integers(6, 14)
    r = rng.uniform(0.04, 0.07) * size
    for x, y in rng.uniform(r, size - r, size=(count, 2)):
        draw.ellipse([x - r, y - r, x + r, y + r], fill=fg)


_PAINTERS: dict[str, Painter] = {
    'circle': _circle, 'square': _polygon(4), 'triangle': _polygon(3), 'cross': _cross,
    'ring': _ring, 'star': _polygon(5, inner=0.45), 'hstripes': _stripes(vertical=False),
    'vstripes': _stripes(vertical=True), 'checkerboard': _checkerboard, 'dots': _dots}


def draw_demo_image(label: int, rng: np.random.Generator, size: int = 72) -> Image.Image:
    """Draw one image of class ``DEMO_IMAGENET_CLASSES[label]`` with random nuisance factors."""
    bg = rng.integers(0, 256, size=3)
    # Foreground differs clearly from the background so the shape is always visible.
    fg = (bg + rng.integers(80, 176, size=3)) % 256
    img = Image.new('RGB', (size, size), tuple(int(c) for c in bg))
    paint = _PAINTERS[DEMO_IMAGENET_CLASSES[label]]
    paint(ImageDraw.Draw(img), rng, size, tuple(int(c) for c in fg))
    noise = rng.normal(0, rng.uniform(4, 16), size=(size, size, 3))
    pixels = np.clip(np.asarray(img, dtype=np.float32) + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)


def make_demo_imagenet(out_dir: str | Path = 'data/demo_in10', num_train: int = 300,
                       num_val: int = 50, size: int = 72, seed: int = 0) -> Path:
    """Write the demo ImageNet under ``out_dir`` (``num_train`` / ``num_val`` images per class);
    return ``out_dir``. The same seed always gives the same files.

    Each image gets its own generator seeded by (seed, split, class, index), so the content of
    an image does not depend on how many others are drawn.
    """
    out_dir = Path(out_dir)
    (out_dir / 'meta').mkdir(parents=True, exist_ok=True)
    for split, per_class in (('train', num_train), ('val', num_val)):
        lines = []
        for label, name in enumerate(DEMO_IMAGENET_CLASSES):
            for i in range(per_class):
                rng = np.random.default_rng([seed, _SPLIT_IDS[split], label, i])
                rel = f'{name}/{name}_{i:05d}.JPEG' if split == 'train' \
                    else f'{name}_val_{i:05d}.JPEG'
                path = out_dir / split / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                draw_demo_image(label, rng, size).save(path, quality=90)
                lines.append(f'{rel} {label}\n')
        (out_dir / 'meta' / f'{split}.txt').write_text(''.join(lines))
    return out_dir
