"""Train any vitdense config (mmdet, mmseg or mmpretrain, chosen by its ``default_scope``).

    python tools/train.py configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py
    bash tools/dist_train.sh CONFIG 8 [--amp] [--resume]
"""
import argparse

from mmengine.registry import RUNNERS
from mmengine.runner import Runner

import vitdense  # noqa: F401  (host-stack fixes, vitdense registries)
from vitdense.engine.launch import load_config, parse_tool_args, tool_parser


def parse_args() -> argparse.Namespace:
    parser = tool_parser(__doc__)
    parser.add_argument('--resume', nargs='?', const='auto', metavar='CHECKPOINT',
                        help='resume from CHECKPOINT, or from the latest one in the work dir')
    parser.add_argument('--amp', action='store_true', help='mixed precision (GPU only)')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the lr by total batch / auto_scale_lr.base_batch_size')
    return parse_tool_args(parser)


def main() -> None:
    args = parse_args()
    cfg, _ = load_config(args.config, args.cfg_options, args.launcher, args.work_dir)
    if args.amp:
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg:
            raise KeyError(f'{args.config} has no auto_scale_lr.base_batch_size to scale from')
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif args.resume is not None:
        cfg.resume, cfg.load_from = True, args.resume
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    runner.train()


if __name__ == '__main__':
    main()
