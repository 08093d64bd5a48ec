"""Train any vitdense config (mmdet, mmseg or mmpretrain, chosen by its ``default_scope``).

    python tools/train.py configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py
    bash tools/dist_train.sh CONFIG 8 [--amp] [--resume] [--compile]

Before training the data is checked (datasets not empty, annotation files parse, the first
batches load). Checkpoints carry the random state, so ``--resume`` continues a killed run
exactly; without ``--resume``, a work dir that holds a checkpoint is refused (``--resume
none`` starts over in it). A step with a non-finite loss or gradient is skipped
(``--max-nonfinite`` in a row stop the run). SIGTERM or SIGUSR1 saves a checkpoint of the
iteration in progress and exits with status 75 (under SLURM the job is requeued first); see
docs/cluster.md.
"""
import argparse

from mmengine.registry import RUNNERS
from mmengine.runner import Runner

import vitdense  # noqa: F401  (vitdense registries)
from vitdense.engine.compile import add_compile_argument, add_compile_hook
from vitdense.model_factory import register_host
from vitdense.engine.launch import join_job, run_tool
from vitdense.engine.preflight import check_data
from vitdense.engine.resume_choice import apply_resume, refuse_to_start_over
from vitdense.engine.tool_config import (add_safety_hooks, load_config, log_to_tensorboard,
                                         parse_tool_args, tool_parser)


def parse_args() -> argparse.Namespace:
    parser = tool_parser(__doc__)
    parser.add_argument('--resume', nargs='?', const='auto', metavar='CHECKPOINT',
                        help='resume from CHECKPOINT, or (alone or "auto") from the newest '
                             'checkpoint of the work dir that loads (says so loudly when there '
                             'is none); "none" starts from iteration 0 in a work dir that holds '
                             'checkpoints, which without --resume is refused')
    parser.add_argument('--max-nonfinite', type=int, default=5, metavar='N',
                        help='stop after N iterations in a row with a non-finite loss')
    parser.add_argument('--skip-data-check', action='store_true',
                        help='do not check the data (annotation files, first batches) first')
    parser.add_argument('--skip-bad-samples', action='store_true',
                        help='skip (and count) training samples that fail to load instead of '
                             'stopping with an error that names them')
    parser.add_argument('--tensorboard', action='store_true',
                        help='also log to TensorBoard (event files in the run\'s vis_data)')
    parser.add_argument('--amp', action='store_true', help='mixed precision (GPU only)')
    add_compile_argument(parser)
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the lr by total batch / auto_scale_lr.base_batch_size')
    return parse_tool_args(parser)


def main() -> None:
    args = parse_args()
    cfg = load_config(args.config, args.cfg_options, args.launcher, args.work_dir,
                      args.dist_timeout)
    register_host(cfg)
    join_job(cfg)
    if args.amp:
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg:
            raise KeyError(f'{args.config} has no auto_scale_lr.base_batch_size to scale from')
        cfg.auto_scale_lr.enable = True
    if args.tensorboard:
        log_to_tensorboard(cfg)
    if args.compile:
        add_compile_hook(cfg, args.compile)
    add_safety_hooks(cfg, max_nonfinite=args.max_nonfinite)
    if args.resume is None:
        refuse_to_start_over(cfg)
    apply_resume(cfg, None if args.resume == 'none' else args.resume)
    if not args.skip_data_check:
        check_data(cfg, skip_bad=args.skip_bad_samples)
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    runner.train()


if __name__ == '__main__':
    run_tool(main)
