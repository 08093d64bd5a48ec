"""Demo: build a vitdense backbone through mmdet's registry and run it on an image.

The image is ``--image`` or, by default, a synthetic scene written to a temporary PNG, so
the demo needs nothing but the installed stack.  It goes through the same path a detection
config does: ``custom_imports`` of vitdense, ``mmdet.registry.MODELS.build`` of
``type='vitdense.XCiT'``, mmdet's data preprocessor (normalise, pad to 32), backbone forward.
"""
from __future__ import annotations

import argparse
import logging
import os.path as osp
import tempfile
import time

import cv2
import mmcv
import numpy as np
import torch
from mmdet.registry import MODELS
from mmdet.utils import register_all_modules
from mmengine.config import Config
from mmengine.logging import MMLogger
from mmengine.utils import import_modules_from_strings

BACKBONE = dict(type='vitdense.XCiT', arch='tiny_12', patch_size=16)


def synthetic_image(path: str, height: int = 480, width: int = 640) -> str:
    """Write a small scene (gradient sky, a box, a disc) as a PNG and return its path."""
    img = np.zeros((height, width, 3), np.uint8)
    img[..., 0] = np.linspace(40, 220, height, dtype=np.uint8)[:, None]
    img[..., 1] = np.linspace(200, 80, width, dtype=np.uint8)[None, :]
    cv2.rectangle(img, (80, 200), (300, 420), (30, 30, 200), thickness=-1)
    cv2.circle(img, (470, 260), 90, (20, 180, 240), thickness=-1)
    cv2.imwrite(path, img)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--image', help='image file (default: a synthetic scene)')
    args = parser.parse_args()

    cfg = Config(dict(custom_imports=dict(imports=['vitdense'], allow_failed_imports=False),
                      backbone=BACKBONE))
    import_modules_from_strings(**cfg.custom_imports)
    register_all_modules(init_default_scope=True)

    with tempfile.TemporaryDirectory() as tmp:
        path = args.image or synthetic_image(osp.join(tmp, 'scene.png'))
        img = mmcv.imread(path, channel_order='rgb')
        print(f'image {args.image or "(synthetic scene)"}: {img.shape[1]}x{img.shape[0]}')

    preprocessor = MODELS.build(dict(
        type='DetDataPreprocessor', mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375], bgr_to_rgb=False, pad_size_divisor=32))
    batch = preprocessor(dict(inputs=[torch.from_numpy(img).permute(2, 0, 1)]))['inputs']

    backbone = MODELS.build(cfg.backbone)
    MMLogger.get_current_instance().setLevel(logging.WARNING)  # per-parameter init report
    backbone.init_weights()
    backbone.eval()
    print(f'built {type(backbone).__module__}.{type(backbone).__name__} via mmdet MODELS '
          f'({sum(p.numel() for p in backbone.parameters()) / 1e6:.1f} M parameters)')
    start = time.perf_counter()
    with torch.no_grad():
        feats = backbone(batch)
    print(f'forward of {tuple(batch.shape)} in {time.perf_counter() - start:.2f} s')
    for i, feat in enumerate(feats):
        print(f'  output {i}: {tuple(feat.shape)}  stride {batch.shape[-1] / feat.shape[-1]:g}'
              f'  mean {feat.mean():+.3f} std {feat.std():.3f}')


if __name__ == '__main__':
    main()
