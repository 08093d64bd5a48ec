"""Backbones to analyse, from any of the checkpoints vitdense reads, and images to feed them.

A backbone comes from a vitdense config (its ``model.backbone``) or a timm model name (our
matching arch, from the families' ``timm_models``); weights come from our checkpoints
(mmengine runs of a classifier, detector or segmentor, or a bare backbone), timm state
dicts or official releases, adapted by the backbone's ``adapt_checkpoint``. With a timm name and
no checkpoint, the timm model's own (random) initialisation is loaded, as in the parity
tests.
"""
from __future__ import annotations

import copy
import os
from typing import Optional, Union

import numpy as np
import torch
from mmengine.config import Config

from vitdense.checkpoint_io import safe_load
from vitdense.models.backbones import ColumnarBackbone, adapt_checkpoint, backbone_families
from vitdense.models.backbones.checkpoint_layout import checkpoint_weights
from vitdense.registry import MODELS

IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)
#: the files the tools take as images: what both OpenCV (the hosts' inferencers) and PIL read
IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png', '.bmp', '.webp', '.tif', '.tiff')


def read_state_dict(checkpoint: Union[str, os.PathLike, dict]) -> dict:
    """The backbone's tensors of a checkpoint file or dict: unwraps its weights as timm does
    (``checkpoint_weights``: a timm ``train.py`` checkpoint's EMA first) and strips the
    ``backbone.`` prefix of whole-model checkpoints (other parts, such as heads, are
    dropped)."""
    if not isinstance(checkpoint, dict):
        if not os.path.isfile(checkpoint):
            raise FileNotFoundError(f'checkpoint not found: {checkpoint}')
        checkpoint = safe_load(checkpoint, map_location='cpu')
    checkpoint = checkpoint_weights(checkpoint)
    if any(key.startswith('backbone.') for key in checkpoint):
        checkpoint = {key[len('backbone.'):]: value for key, value in checkpoint.items()
                      if key.startswith('backbone.')}
    return checkpoint


def load_weights(model: ColumnarBackbone, state_dict: dict) -> ColumnarBackbone:
    """Load a checkpoint of any layout the family reads, adapted explicitly: exactly, or
    refused with what the checkpoint is and the option that loads it (the backbone's
    ``adapt_checkpoint``; only tensors new in fine-tuning, such as the pyramid, may be absent)."""
    model.load_state_dict(adapt_checkpoint(model, state_dict), strict=False)
    return model


def backbone_from_config(config: Union[str, Config, dict], out_type: str = 'cls_token',
                         **overrides) -> ColumnarBackbone:
    """Build ``model.backbone`` of a vitdense config (or a backbone dict) as ``out_type``."""
    if isinstance(config, str):
        config = Config.fromfile(config)
    cfg = config.get('model', config)
    cfg = copy.deepcopy(dict(cfg.get('backbone', cfg)))
    cfg.pop('init_cfg', None)
    cfg.update(out_type=out_type, **overrides)
    model = MODELS.build(cfg)
    if not isinstance(model, ColumnarBackbone):
        raise TypeError(f'{cfg["type"]} is not a vitdense columnar backbone')
    return model


def backbone_for_timm(name: str, out_type: str = 'cls_token', **overrides) -> ColumnarBackbone:
    """Our backbone matching timm model ``name`` (weights not loaded)."""
    known = []
    for cls in backbone_families().values():
        for arch, options, timm_name in cls.timm_models:
            if timm_name == name:
                return cls(arch, out_type=out_type, **{**options, **overrides})
            if timm_name:
                known.append(timm_name)
    known.sort()
    raise KeyError(f'no vitdense arch matches timm model {name!r}; known: {", ".join(known)}')


def timm_random_state_dict(name: str, seed: int = 0) -> dict:
    """The state dict of a freshly initialised timm model (no download)."""
    import timm
    torch.manual_seed(seed)
    return timm.create_model(name, pretrained=False).state_dict()


def build_backbone(config: Optional[str] = None, timm_name: Optional[str] = None,
                   checkpoint: Optional[str] = None, out_type: str = 'cls_token',
                   **overrides) -> ColumnarBackbone:
    """A backbone in eval mode from a config or a timm name, with weights from
    ``checkpoint`` (or timm's random initialisation for a timm name without one)."""
    if (config is None) == (timm_name is None):
        raise ValueError('give exactly one of a config or a timm model name')
    if config is not None:
        model = backbone_from_config(config, out_type, **overrides)
    else:
        model = backbone_for_timm(timm_name, out_type, **overrides)
    if checkpoint is not None:
        load_weights(model, read_state_dict(checkpoint))
    elif timm_name is not None:
        load_weights(model, timm_random_state_dict(timm_name))
    return model.eval()


def image_to_tensor(image: np.ndarray, size: Optional[tuple[int, int]] = None) -> torch.Tensor:
    """(1, 3, H, W) input from an RGB uint8 (H, W, 3) image: resized to ``size`` (bicubic)
    if given, normalised with the ImageNet mean and std of the configs' preprocessors."""
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f'expected an RGB image of shape (H, W, 3), got {image.shape}')
    tensor = torch.from_numpy(np.array(image)).permute(2, 0, 1)[None].float()
    if size is not None and tuple(size) != tuple(tensor.shape[-2:]):
        tensor = torch.nn.functional.interpolate(tensor, size=tuple(size), mode='bicubic',
                                                 align_corners=False).clamp(0, 255)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (tensor - mean) / std
