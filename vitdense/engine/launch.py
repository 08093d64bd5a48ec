"""What ``tools/train.py`` and ``tools/test.py`` share: one config, any of three host libraries.

A vitdense config names its host library in ``default_scope`` (``mmdet``, ``mmseg`` or
``mmpretrain``). The host is imported and registered here by name, so this module itself
imports none of them, and the few places where the hosts' tools differ (how test images are
drawn, how predictions are dumped) are one table.
"""
from __future__ import annotations

import importlib
import os
import os.path as osp
from dataclasses import dataclass
from typing import Callable

import torch
from mmengine.config import Config, ConfigDict
from mmengine.logging import print_log


def _draw_mmdet(cfg: Config, show_dir: str) -> None:
    cfg.default_hooks.visualization.update(draw=True, test_out_dir=osp.abspath(show_dir))


def _draw_mmseg(cfg: Config, show_dir: str) -> None:
    cfg.default_hooks.visualization.draw = True
    cfg.visualizer.save_dir = osp.abspath(show_dir)


def _draw_mmpretrain(cfg: Config, show_dir: str) -> None:
    cfg.default_hooks.visualization.update(enable=True, out_dir=osp.abspath(show_dir))


@dataclass(frozen=True)
class Host:
    """How one OpenMMLab library's own tools draw and dump test results."""

    scope: str
    draw: Callable[[Config, str], None]
    dump_metric: Callable[[str], dict]
    out_help: str


HOSTS = {
    'mmdet': Host('mmdet', _draw_mmdet,
                  lambda out: dict(type='DumpDetResults', out_file_path=out),
                  'pickle file of the predictions (masks RLE-encoded)'),
    'mmseg': Host('mmseg', _draw_mmseg,
                  lambda out: dict(type='IoUMetric', output_dir=out, format_only=True),
                  'folder for the predicted label maps (PNG)'),
    'mmpretrain': Host('mmpretrain', _draw_mmpretrain,
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
    """Multi-process training without GPUs: gloo process group, DDP without device ids.

    mmengine's ``init_dist`` calls ``torch.cuda.set_device`` and its default DDP wrapper passes
    ``device_ids=[LOCAL_RANK]``; both assume one GPU per process. The process group is opened
    here (the Runner skips ``init_dist`` when one exists) and the wrapper gets no device ids.
    """
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend='gloo')
    wrapper = ConfigDict(cfg.get('model_wrapper_cfg') or dict(type='MMDistributedDataParallel'))
    wrapper.setdefault('device_ids', None)
    cfg.model_wrapper_cfg = wrapper
    print_log(f'no CUDA device: rank {os.environ.get("RANK")} of '
              f'{os.environ.get("WORLD_SIZE")} runs on CPU with the gloo backend',
              logger='current')


def add_test_metric(cfg: Config, metric: dict) -> None:
    """Append ``metric`` to the test evaluator (a dict or a list of dicts)."""
    evaluator = cfg.test_evaluator
    metrics = list(evaluator) if isinstance(evaluator, (list, tuple)) else [evaluator]
    cfg.test_evaluator = metrics + [metric]
