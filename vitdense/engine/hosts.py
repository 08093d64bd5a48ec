"""A config's host library, and its model built for a purpose.

A vitdense config names its host library in ``default_scope`` (``mmdet``, ``mmseg`` or
``mmpretrain``). :func:`host_of` imports and registers it by name, so this module itself
imports none of them; the few places where the hosts' tools differ (how test images are
drawn, how predictions are dumped) are one table, :data:`HOSTS`. :func:`build_model` is the
one way the tools, converters, benchmarks and analyses build a config's model.
"""
from __future__ import annotations

import importlib
import os.path as osp
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.registry import MODELS, DefaultScope
from mmengine.runner import load_checkpoint

from vitdense.checkpoint_io import use_safe_loading
from vitdense.compat import apply_host_fixes


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
    """Import and register the library that ``cfg.default_scope`` names, after vitdense's
    host fixes (``vitdense.compat``); mmengine loads local checkpoints with weights_only=True
    (``use_safe_loading``), also where no Runner builds a ``SafeCheckpointHook`` (inference)."""
    scope = cfg.get('default_scope')
    if scope not in HOSTS:
        raise ValueError(f'config default_scope={scope!r}: vitdense tools run configs of '
                         f'{sorted(HOSTS)}')
    apply_host_fixes()
    use_safe_loading()
    importlib.import_module(f'{scope}.utils').register_all_modules(init_default_scope=False)
    return HOSTS[scope]


PURPOSES = ('train', 'deploy', 'count')


def build_model(cfg: Config, purpose: str, checkpoint: Optional[str] = None,
                device: str | torch.device = 'cpu') -> nn.Module:
    """``cfg.model`` built through its host's registry for ``purpose``, on ``device``.

    Every purpose merges the config's top-level ``data_preprocessor`` into the model, as
    mmengine's Runner does.

    - ``'train'``: the model as the Runner builds it (a distillation teacher and pretrained
      ``init_cfg`` kept); its weights as constructed (the Runner calls ``init_weights``).
    - ``'deploy'``: without a teacher (a training-time helper, kept out of checkpoints), in
      eval mode, with the weights of ``checkpoint`` (all of them: a strict load), or
      initialised as for training when ``checkpoint`` is None.
    - ``'count'``: the architecture alone, to count parameters, FLOPs or memory or to check a
      state dict's keys and shapes: no teacher and no pretrained ``init_cfg`` (the model's
      or its backbone's), nothing loaded; ``device='meta'`` builds it without memory.
    """
    if purpose not in PURPOSES:
        raise ValueError(f'unknown purpose {purpose!r}; expected one of {PURPOSES}')
    if checkpoint is not None and purpose != 'deploy':
        raise ValueError(f"a checkpoint is loaded for purpose 'deploy', not {purpose!r}")
    host_of(cfg)
    model_cfg = cfg.model.copy()
    if 'data_preprocessor' in cfg:
        model_cfg.setdefault('data_preprocessor', cfg.data_preprocessor)
    if purpose != 'train':
        model_cfg.pop('teacher', None)
    if purpose == 'count':
        model_cfg.pop('init_cfg', None)
        if model_cfg.get('backbone', {}).get('init_cfg') is not None:
            model_cfg.backbone = dict(model_cfg.backbone, init_cfg=None)
    with DefaultScope.overwrite_default_scope(cfg.default_scope), torch.device(device):
        model = MODELS.build(model_cfg)
    if purpose != 'deploy':
        return model
    if checkpoint is None:
        model.init_weights()
    else:
        load_checkpoint(model, checkpoint, map_location='cpu', strict=True, logger='silent')
    return model.eval()


def image_normalization(preprocessor: nn.Module) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """The ``(mean, std)`` a host data preprocessor normalises images with, shaped (C, 1, 1),
    or None when it does not normalise: mmengine's, mmseg's and mmpretrain's preprocessors
    register the ``mean`` and ``std`` buffers exactly when they normalise."""
    buffers = dict(preprocessor.named_buffers(recurse=False))
    if 'mean' not in buffers:
        return None
    return buffers['mean'], buffers['std']
