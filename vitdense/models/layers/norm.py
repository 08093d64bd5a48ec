"""Normalisation layers for NCHW maps, built from mmcv-style ``norm_cfg`` dicts without mmcv."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW map."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight,
                         self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


NORM2D_LAYERS = {
    'BN': nn.BatchNorm2d,
    'SyncBN': nn.SyncBatchNorm,
    'GN': nn.GroupNorm,
    'LN': LayerNorm2d,
}


def build_norm2d(cfg: dict, num_channels: int) -> nn.Module:
    """Build a channel norm from ``dict(type='BN'|'SyncBN'|'GN'|'LN', ...)``.

    ``GN`` needs ``num_groups``; other keys are passed to the layer (``eps``, ``momentum``).
    ``requires_grad=False`` freezes the affine parameters, as in mmcv.
    """
    cfg = dict(cfg)
    norm_type = cfg.pop('type')
    requires_grad = cfg.pop('requires_grad', True)
    if norm_type not in NORM2D_LAYERS:
        raise KeyError(f'unknown norm type {norm_type!r}; expected one of {sorted(NORM2D_LAYERS)}')
    if norm_type == 'GN':
        if 'num_groups' not in cfg:
            raise KeyError("norm_cfg of type 'GN' needs 'num_groups'")
        layer = nn.GroupNorm(num_channels=num_channels, **cfg)
    else:
        layer = NORM2D_LAYERS[norm_type](num_channels, **cfg)
    for param in layer.parameters():
        param.requires_grad = requires_grad
    return layer
