"""The multi-layer pyramid of XCiT §4.2: columnar features taken from several blocks, all
at the patch stride, are brought to strides 4, 8, 16 and 32 for FPN-style necks (or to those
of the levels a neck asks for)."""
import math
from typing import Sequence

import torch
import torch.nn as nn

from .norm import build_norm2d

PYRAMID_STRIDES = (4, 8, 16, 32)


def rescale(dims: int, scale: float, norm_cfg: dict, ceil_mode: bool = True,
            halve_width: bool = False) -> tuple[nn.Module, int]:
    """The module bringing a map of width ``dims`` ``scale`` (a power of two) times finer,
    and the width it gives.

    Up: 2×2 stride-2 transposed convs with norm + GELU between them, keeping the width (XCiT's
    official detection code) or halving it at each step (``halve_width``: ViTDet). Down: max
    pooling; ``ceil_mode`` keeps the level at ceil(H / stride) for inputs that are no multiple
    of the stride.
    """
    if scale == 1:
        return nn.Identity(), dims
    if scale < 1:
        kernel = round(1 / scale)
        return nn.MaxPool2d(kernel, kernel, ceil_mode=ceil_mode), dims
    layers: list[nn.Module] = []
    for step in range(int(math.log2(scale))):
        if step:
            layers += [build_norm2d(norm_cfg, dims), nn.GELU()]
        out_dims = dims // 2 if halve_width else dims
        layers.append(nn.ConvTranspose2d(dims, out_dims, 2, stride=2))
        dims = out_dims
    return nn.Sequential(*layers), dims


def _crop(feature: torch.Tensor, hw: list) -> torch.Tensor:
    """The top-left ``hw`` of a (B, C, H, W) map: a slice (a view, no copy) in eager mode
    and under ``torch.compile``; under ``torch.export`` rows and columns are gathered
    instead, since a slice tests whether it keeps everything, which an exported graph would
    fix at the traced size, while a gather holds for any size."""
    if not torch.compiler.is_exporting():
        return feature[:, :, :hw[0], :hw[1]]
    rows = torch.arange(hw[0], device=feature.device)
    cols = torch.arange(hw[1], device=feature.device)
    return feature.index_select(2, rows).index_select(3, cols)


def check_levels(levels: Sequence[int]) -> tuple[int, ...]:
    """``levels`` as a tuple, or a ValueError naming the valid choices: increasing, unique
    indices into :data:`PYRAMID_STRIDES`."""
    levels = tuple(levels)
    if not levels or any(not isinstance(level, int) or not 0 <= level < len(PYRAMID_STRIDES)
                         for level in levels) or list(levels) != sorted(set(levels)):
        raise ValueError(f'pyramid levels are increasing, unique indices into the strides '
                         f'{PYRAMID_STRIDES} (0-{len(PYRAMID_STRIDES) - 1}), e.g. (1, 2, 3) for '
                         f'strides 8-32; got {levels}')
    return levels


class MultiLevelPyramid(nn.Module):
    """Maps feature maps at stride ``patch_size``, one per level of ``levels``, to the
    strides of those levels: all four (4/8/16/32, modules ``fpn1``..``fpn4``) by default,
    ``(1, 2, 3)`` for the 3-level necks (strides 8-32, ``fpn2``..``fpn4``).

    ``crop=True``: pooling in ceil mode and every level cropped to ceil(H / stride) ×
    ceil(W / stride) of the unpadded image, so the levels stay aligned with the input
    whatever its size. ``crop=False``: pooling in floor mode and no cropping, as the
    official XCiT code (a 43-column grid gives 172 columns at stride 4 and 21 at stride 32).
    """

    def __init__(self, embed_dims: int, patch_size: int, norm_cfg: dict,
                 crop: bool = True, levels: Sequence[int] = (0, 1, 2, 3)) -> None:
        super().__init__()
        if patch_size & (patch_size - 1) or not 4 <= patch_size <= 32:
            raise ValueError(f'the pyramid needs a power-of-two patch size in [4, 32], got '
                             f'{patch_size}; use pyramid=False for patch size {patch_size}')
        self.crop = crop
        self.levels = check_levels(levels)
        for level in self.levels:
            self.add_module(f'fpn{level + 1}', rescale(
                embed_dims, patch_size / PYRAMID_STRIDES[level], norm_cfg, ceil_mode=crop)[0])

    def forward(self, features: list[torch.Tensor],
                image_hw: tuple[int, int]) -> tuple[torch.Tensor, ...]:
        """``image_hw``: the size of the unpadded input, which ``crop`` trims the levels to."""
        outs = []
        for level, feature in zip(self.levels, features):
            stride = PYRAMID_STRIDES[level]
            out = getattr(self, f'fpn{level + 1}')(feature)
            if self.crop:
                out = _crop(out, [(size + stride - 1) // stride for size in image_hw])
            outs.append(out)
        return tuple(outs)
