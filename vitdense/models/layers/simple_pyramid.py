"""ViTDet's simple feature pyramid (Li et al., 2022, §3, Fig. 2c): every level comes from
the last block's map at the patch stride, with no top-down or lateral paths between levels.

From a stride-16 map: two 2×2 transposed convs (LayerNorm + GELU between them, halving the
width each time) to stride 4, one to stride 8, the map itself at 16 and 2×2 max pooling to
32; each level then goes through a 1×1 and a 3×3 conv to the FPN width, each followed by
LayerNorm (no conv bias). The extra level detectors' RPNs use is a stride-2 subsampling
of the coarsest level, as detectron2's ``LastLevelMaxPool`` and mmdet's FPN do.
"""
import math
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .norm import build_norm2d
from .pyramid import rescale

#: scale factors from the patch stride: 4 and 2 up, 1 kept, 0.5 down (ViTDet's)
SCALE_FACTORS = (4., 2., 1., .5)


class ConvNorm(nn.Sequential):
    """A bias-free conv followed by a channel norm."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int,
                 norm_cfg: dict) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size,
                              padding=kernel_size // 2, bias=False)
        self.norm = build_norm2d(norm_cfg, out_channels)


class SimpleFeaturePyramid(nn.Module):
    """Levels at ``patch_size / scale`` for each scale of ``scale_factors`` from the last
    map of a backbone's outputs, ``out_channels`` wide, plus ``num_outs -
    len(scale_factors)`` extra levels, each subsampling the previous by 2.

    Args:
        in_channels: width of the backbone's map (its ``embed_dims``).
        out_channels: width of every level (the FPN width, 256).
        scale_factors: powers of two; ViTDet's (4, 2, 1, 0.5) gives strides 4-32 from 16.
        num_outs: levels returned: 5 for detectors (RPN's stride-64 level), 4 for UperNet.
        norm_cfg: the norm after every conv and between the transposed convs.
    """

    def __init__(self, in_channels: int, out_channels: int = 256,
                 scale_factors: Sequence[float] = SCALE_FACTORS, num_outs: int = 5,
                 norm_cfg: dict = dict(type='LN', eps=1e-6)) -> None:
        super().__init__()
        for scale in scale_factors:
            if scale <= 0 or not math.log2(scale).is_integer() or \
                    (scale > 1 and in_channels % round(scale)):
                raise ValueError(f'scale factors must be powers of two (with in_channels '
                                 f'{in_channels} divisible by the upsampling ones), got '
                                 f'{list(scale_factors)}')
        if num_outs < len(scale_factors):
            raise ValueError(f'num_outs {num_outs} < {len(scale_factors)} scale factors')
        self.num_outs = num_outs
        self.rescales = nn.ModuleList()
        self.lateral_convs = nn.ModuleList()
        self.fpn_convs = nn.ModuleList()
        for scale in scale_factors:
            layer, dims = rescale(in_channels, scale, norm_cfg, halve_width=True)
            self.rescales.append(layer)
            self.lateral_convs.append(ConvNorm(dims, out_channels, 1, norm_cfg))
            self.fpn_convs.append(ConvNorm(out_channels, out_channels, 3, norm_cfg))

    def forward(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """``inputs``: the backbone's maps; the last one (its last block) is used."""
        feature = inputs[-1]
        outs = [fpn(lateral(rescale(feature))) for rescale, lateral, fpn in
                zip(self.rescales, self.lateral_convs, self.fpn_convs)]
        while len(outs) < self.num_outs:
            outs.append(F.max_pool2d(outs[-1], 1, stride=2))
        return tuple(outs)
