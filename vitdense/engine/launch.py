"""What ``tools/train.py`` and ``tools/test.py`` share: one config, any of three host libraries.

A vitdense config names its host library in ``default_scope`` (``mmdet``, ``mmseg`` or
``mmpretrain``). The host is imported and registered here by name, so this module itself
imports none of them, and the few places where the hosts' tools differ (how test images are
drawn, how predictions are dumped) are one table.
"""
from __future__ import annotations

import argparse
import importlib
import os
import os.path as osp
from dataclasses import dataclass
from typing import Callable

import torch
from mmengine.config import Config, ConfigDict, DictAction
from mmengine.logging import print_log


def _draw_mmdet(cfg: Config, show_dir: str) -> None:
    cfg.default_hooks.visualization.update(draw=True, test_out_dir=osp.abspath(show_dir))


def _draw_mmseg(cfg: Config, show_dir: str) -> None:
    cfg.default_hooks.visualization.update(draw=True, interval=1)
    cfg.visualizer.save_dir = osp.abspath(show_dir)


def _draw_mmpretrain(cfg: Config, show_dir: str) -> None:
    cfg.default_hooks.visualization.update(enable=True, interval=1,
                                           out_dir=osp.abspath(show_dir))


@dataclass(frozen=True)
class Host:
    """How one OpenMMLab library's own tools draw (every image) and dump test results."""

    draw: Callable[[Config, str], None]
    dump_metric: Callable[[str], dict]
    out_help: str


HOSTS = {
    'mmdet': Host(_draw_mmdet,
                  lambda out: dict(type='DumpDetResults', out_file_path=out),
                  'pickle file of the predictions (masks RLE-encoded)'),
    'mmseg': Host(_draw_mmseg,
                  lambda out: dict(type='IoUMetric', output_dir=out, format_only=True),
                  'folder for the predicted label maps (PNG)'),
    'mmpretrain': Host(_draw_mmpretrain,
                       lambda out: dict(type='DumpResults', out_file_path=out),
                       'pickle file of the predictions'),
}


def host_of(cfg: Config) -> Host:
    """Import and register the library that ``cfg.default_scope`` names."""
    scope = cfg.get('default_scope')
    if scope not in HOSTS:
        raise ValueError(f'config default_scope={scope!r}: vitdense tools run configs of '
                         f'{sorted(HOSTS)}')
    importlib.import_module(f'{scope}.utils').register_all_modules(init_default_scope=False)
    return HOSTS[scope]


def tool_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every OpenMMLab train/test tool takes: config, work dir, overrides, launcher."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='config file')
    parser.add_argument('--work-dir', help='where logs, checkpoints and metrics go')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, key=value (e.g. train_cfg.max_iters=10)')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local-rank', '--local_rank', type=int, default=0)
    return parser


def parse_tool_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Parse, and export LOCAL_RANK for launchers that pass it as an argument."""
    args = parser.parse_args()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def load_config(path: str, cfg_options: dict | None, launcher: str,
                work_dir: str | None) -> tuple[Config, Host]:
    """Read a config, apply ``--cfg-options``, the launcher and the work dir, load its host.

    The work dir is, by priority, ``work_dir``, the config's own, ``work_dirs/<config name>``.
    """
    if not osp.isfile(path):
        raise FileNotFoundError(f'config file not found: {path}')
    cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    cfg.launcher = launcher
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('work_dirs', osp.splitext(osp.basename(path))[0])
    if launcher != 'none' and not torch.cuda.is_available():
        _prepare_cpu_distributed(cfg)
    return cfg, host_of(cfg)


def _prepare_cpu_distributed(cfg: Config) -> None:
    """Multi-process training without GPUs: gloo process group, DDP without device ids, BN.

    mmengine's ``init_dist`` calls ``torch.cuda.set_device`` and its default DDP wrapper passes
    ``device_ids=[LOCAL_RANK]``; both assume one GPU per process. The process group is opened
    here (the Runner skips ``init_dist`` when one exists) and the wrapper gets no device ids.
    torch's DDP refuses SyncBatchNorm in CPU modules (statistics sync needs an accelerator),
    so ``SyncBN`` norm configs become ``BN``: each process normalises with its own batch, as
    mmengine does for single-process runs.
    """
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend='gloo')
    wrapper = ConfigDict(cfg.get('model_wrapper_cfg') or dict(type='MMDistributedDataParallel'))
    wrapper.setdefault('device_ids', None)
    cfg.model_wrapper_cfg = wrapper
    replaced = _sync_bn_to_bn(cfg.model)
    print_log(f'no CUDA device: rank {os.environ.get("RANK")} of '
              f'{os.environ.get("WORLD_SIZE")} runs on CPU with the gloo backend; '
              f'{replaced} SyncBN norm configs use BN', logger='current')


def _sync_bn_to_bn(node) -> int:
    """Turn every ``dict(type='SyncBN', ...)`` below ``node`` into BN; return how many."""
    if isinstance(node, dict):
        count = 0
        if node.get('type') == 'SyncBN':
            node['type'] = 'BN'
            count = 1
        return count + sum(_sync_bn_to_bn(value) for value in node.values())
    if isinstance(node, (list, tuple)):
        return sum(_sync_bn_to_bn(value) for value in node)
    return 0


def point_at_data_root(cfg: Config, data_root: str | os.PathLike) -> None:
    """Read every split from ``data_root``; evaluators with an annotation file (COCO) read
    the file of the same name from ``data_root/annotations``."""
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.data_root = str(data_root)
    for evaluator in ('val_evaluator', 'test_evaluator'):
        if 'ann_file' in cfg[evaluator]:
            name = osp.basename(cfg[evaluator].ann_file)
            cfg[evaluator].ann_file = osp.join(str(data_root), 'annotations', name)


def add_test_metric(cfg: Config, metric: dict) -> None:
    """Append ``metric`` to the test evaluator (a dict or a list of dicts)."""
    evaluator = cfg.test_evaluator
    metrics = list(evaluator) if isinstance(evaluator, (list, tuple)) else [evaluator]
    cfg.test_evaluator = metrics + [metric]
