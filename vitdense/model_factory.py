"""A config's host library registered, and its model built for a purpose.

A vitdense config names its host library in ``default_scope`` (``mmdet``, ``mmseg`` or
``mmpretrain``). :func:`register_host` imports and registers it by name, an explicit call
(idempotent) made by the tools and by :func:`build_model`, so that this module imports none
of them. :func:`build_model` is the one way the tools, converters, benchmarks and analyses
build a config's model; :func:`image_normalization` reads the normalisation a host data
preprocessor applies.
"""
from __future__ import annotations

import importlib
from typing import Optional

import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.registry import MODELS, DefaultScope
from mmengine.runner import load_checkpoint

from vitdense.checkpoint_io import use_safe_loading
from vitdense.compat import apply_host_fixes

#: the host libraries a vitdense config may name in ``default_scope``
HOST_SCOPES = ('mmdet', 'mmpretrain', 'mmseg')
PURPOSES = ('train', 'deploy', 'count')


def host_scope(cfg: Config) -> str:
    """``cfg.default_scope``, checked to be a host library vitdense runs."""
    scope = cfg.get('default_scope')
    if scope not in HOST_SCOPES:
        raise ValueError(f'config default_scope={scope!r}: vitdense tools run configs of '
                         f'{list(HOST_SCOPES)}')
    return scope


def register_host(cfg: Config) -> None:
    """Import and register the library that ``cfg.default_scope`` names (idempotent), after
    vitdense's host fixes (``vitdense.compat``); mmengine then loads local checkpoints with
    weights_only=True (``use_safe_loading``), also where no Runner builds a
    ``SafeCheckpointHook`` (inference)."""
    scope = host_scope(cfg)
    apply_host_fixes()
    use_safe_loading()
    importlib.import_module(f'{scope}.utils').register_all_modules(init_default_scope=False)


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
    register_host(cfg)
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
