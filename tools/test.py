"""Evaluate a checkpoint of any vitdense config (mmdet, mmseg or mmpretrain).

    python tools/test.py CONFIG CHECKPOINT [--show-dir DIR] [--out FILE_OR_DIR] [--compile]
                         [--tta]
    bash tools/dist_test.sh CONFIG CHECKPOINT 8

``--tta`` evaluates with the config's test-time augmentation (docs/evaluation.md), as mmdet's
and mmseg's own test tools do: the model becomes ``tta_model`` wrapping it and the test set is
read through ``tta_pipeline``.
"""
import argparse

from mmengine.config import Config, ConfigDict
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

import vitdense  # noqa: F401  (vitdense registries)
from vitdense.engine.compile import add_compile_argument, add_compile_hook
from vitdense.engine.hosts import HOSTS, host_of
from vitdense.model_factory import register_host
from vitdense.engine.launch import join_job, run_tool
from vitdense.engine.tool_config import add_test_metric, load_config, parse_tool_args, tool_parser


def parse_args() -> argparse.Namespace:
    parser = tool_parser(__doc__)
    parser.add_argument('checkpoint', help='checkpoint file or URL')
    parser.add_argument('--out', help='save predictions: ' + '; '.join(
        f'{scope}: {host.out_help}' for scope, host in HOSTS.items()))
    parser.add_argument('--show-dir', help='save pictures of the predictions here')
    parser.add_argument('--tta', action='store_true',
                        help="test-time augmentation: the config's tta_model and tta_pipeline")
    add_compile_argument(parser)
    return parse_tool_args(parser)


def use_tta(cfg: Config) -> None:
    """Evaluate ``cfg`` with test-time augmentation: its ``tta_model`` wraps its model and its
    test set (inside any dataset wrappers) is read through ``tta_pipeline``."""
    missing = [key for key in ('tta_model', 'tta_pipeline') if key not in cfg]
    if missing:
        raise ValueError(f'--tta needs tta_model and tta_pipeline in the config; it lacks '
                         f'{" and ".join(missing)} (see docs/evaluation.md)')
    cfg.model = ConfigDict(**cfg.tta_model, module=cfg.model)
    dataset = cfg.test_dataloader.dataset
    while 'dataset' in dataset:
        dataset = dataset.dataset
    dataset.pipeline = cfg.tta_pipeline


def main() -> None:
    args = parse_args()
    cfg = load_config(args.config, args.cfg_options, args.launcher, args.work_dir,
                      args.dist_timeout)
    register_host(cfg)
    host = host_of(cfg)
    join_job(cfg)
    cfg.load_from = args.checkpoint
    if args.show_dir:
        host.draw(cfg, args.show_dir)
    if args.out:
        add_test_metric(cfg, host.dump_metric(args.out))
    if args.tta:
        use_tta(cfg)
    if args.compile:
        add_compile_hook(cfg, args.compile)
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    runner.test()


if __name__ == '__main__':
    run_tool(main)
