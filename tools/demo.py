"""The main job on built-in data: Mask R-CNN with an XCiT backbone, from scratch, on the demo COCO set.

1. writes the seeded demo COCO set (``data/demo_coco``: 400 + 100 images of coloured circles,
   squares and triangles with exact masks) unless it is there;
2. trains ``configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py`` for ``--minutes`` (the
   learning rate anneals over the time budget, so the run ends on time on any machine);
3. evaluates the last checkpoint on the validation split with mmdet's COCO evaluator
   (pycocotools bbox and segm mAP) and prints the metric table;
4. draws every validation prediction and saves a grid of the first ones as ``predictions.png``.

    python tools/demo.py                    # ~10 min on a 2-core CPU
    python tools/demo.py --minutes 3 --work-dir work_dirs/quick
    python tools/demo.py --resume           # after a kill: goes on with the budget left

A checkpoint is written each tenth of the budget; ``--resume`` continues from the newest one
that loads, with the budget already spent counted and the random state restored.
"""
from __future__ import annotations

import argparse
import logging
import os.path as osp
from pathlib import Path

import cv2
import numpy as np
from mmengine.logging import MMLogger
from mmengine.runner import Runner

import vitdense  # noqa: F401  (vitdense registries)
from vitdense.engine import train_on_time_budget
from vitdense.demo_data import make_demo_coco
from vitdense.engine.hosts import host_of
from vitdense.model_factory import register_host
from vitdense.engine.preflight import check_data
from vitdense.engine.resume_choice import apply_resume
from vitdense.engine.tool_config import add_safety_hooks, load_config, point_at_data_root

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / 'configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py'
METRICS = ('mAP', 'mAP_50', 'mAP_75', 'mAP_s', 'mAP_m', 'mAP_l')


def metric_table(metrics: dict) -> str:
    """COCO box and mask metrics as a markdown table, one row per task."""
    lines = ['| task | ' + ' | '.join(METRICS) + ' |', '|---' * (len(METRICS) + 1) + '|']
    for task in ('bbox', 'segm'):
        values = [metrics.get(f'coco/{task}_{name}', float('nan')) for name in METRICS]
        lines.append(f'| {task} | ' + ' | '.join(f'{v:.3f}' for v in values) + ' |')
    return '\n'.join(lines)


def picture_grid(drawn: list[Path], out: Path, columns: int = 4) -> None:
    """Tile the drawn prediction images (ground truth | prediction pairs) into one PNG."""
    if not drawn:
        raise FileNotFoundError(f'no drawn predictions to tile into {out}')
    images = [cv2.imread(str(path)) for path in drawn]
    height = max(img.shape[0] for img in images)
    width = max(img.shape[1] for img in images)
    tiles = [cv2.copyMakeBorder(img, 0, height - img.shape[0], 0, width - img.shape[1],
                                cv2.BORDER_CONSTANT, value=(255, 255, 255)) for img in images]
    tiles += [np.full_like(tiles[0], 255)] * (-len(tiles) % columns)
    rows = [np.hstack(tiles[i:i + columns]) for i in range(0, len(tiles), columns)]
    cv2.imwrite(str(out), np.vstack(rows))


def main(argv: list[str] | None = None) -> None:
    """Run the demo with ``argv`` as its command line (``sys.argv``'s arguments by default)."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--minutes', type=float, default=10.0, help='training time budget')
    parser.add_argument('--data-root', default='data/demo_coco', help='demo COCO set folder')
    parser.add_argument('--work-dir', default='work_dirs/demo_mask-rcnn_xcit',
                        help='logs, checkpoint, metrics and pictures')
    parser.add_argument('--num-pictures', type=int, default=8,
                        help='validation images in predictions.png')
    parser.add_argument('--resume', action='store_true',
                        help='continue the run in --work-dir from its newest checkpoint')
    args = parser.parse_args(argv)

    data_root = Path(args.data_root)
    if not (data_root / 'annotations' / 'instances_val.json').exists():
        make_demo_coco(data_root)
        print(f'wrote the demo COCO set to {data_root}')
    work_dir = Path(args.work_dir).resolve()
    cfg = load_config(str(CONFIG), None, 'none', str(work_dir))
    register_host(cfg)
    host = host_of(cfg)
    point_at_data_root(cfg, str(data_root))
    train_on_time_budget(cfg, args.minutes)
    add_safety_hooks(cfg)
    apply_resume(cfg, 'auto' if args.resume else None)
    check_data(cfg)
    show_dir = work_dir / 'show'
    host.draw(cfg, str(show_dir))

    print(f'training {osp.relpath(CONFIG, ROOT)} for {args.minutes:g} min; logs in {work_dir}')
    runner = Runner.from_cfg(cfg)
    runner.train()
    MMLogger.get_current_instance().setLevel(logging.WARNING)
    metrics = runner.test()

    table = metric_table(metrics)
    (work_dir / 'metrics.md').write_text(table + '\n')
    drawn = sorted(show_dir.rglob('*.jpg')) + sorted(show_dir.rglob('*.png'))
    picture = work_dir / 'predictions.png'
    picture_grid(drawn[:args.num_pictures], picture)
    print(f'\nMask R-CNN, XCiT backbone, {runner.iter} iterations from scratch, '
          f'{len(drawn)} validation images:\n{table}\n')
    print(f'predictions (left: ground truth, right: prediction): {picture}')


if __name__ == '__main__':
    main()
