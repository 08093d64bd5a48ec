"""Rotary position embeddings on the patch grid (RoFormer, Su et al. 2021), in the two 2-D
forms ViTs are released with, computed as timm's ``eva.py`` computes them:

- ``'eva02'`` (EVA-02, Fang et al. 2023, §2): integer patch coordinates rescaled to the
  pretraining grid (``ref_grid``: coordinate ``i`` of a grid of ``n`` rows is
  ``i · ref / n``), frequencies ``temperature^(-j / bands)``, channels rotated in
  interleaved pairs;
- ``'dinov3'`` (DINOv3, Siméoni et al. 2025): patch centres normalised to [-1, 1] along each
  axis, periods ``temperature^(2j / (head_dim / 2))``, channels rotated in halves.

A quarter of the head width takes each axis's sines and cosines. The rotation is built for
the grid it is given, so any input size and ViTDet's windows (each window its own grid, as
EVA-02's detectors do) get their positions without a table to resample; prefix tokens
(class token, registers) are left unrotated, as in timm.
"""
import math
from typing import Optional

import torch
import torch.nn as nn

from .grid import Grid

ROPE_STYLES = ('eva02', 'dinov3')
#: the temperature each style's releases use
DEFAULT_TEMPERATURE = {'eva02': 10000., 'dinov3': 100.}


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """[x0, x1, x2, x3, ...] -> [-x1, x0, -x3, x2, ...]."""
    return torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2)


def _rotate_halves(x: torch.Tensor) -> torch.Tensor:
    """[a, b] -> [-b, a] for the two halves of the last axis."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class RotaryPositionEmbedding(nn.Module):
    """Rotates queries or keys (..., N, head_dim) by the positions of their patches.

    Args:
        head_dim: width of one head (a multiple of 4).
        style: one of ``ROPE_STYLES``.
        temperature: frequency base (None: the style's, ``DEFAULT_TEMPERATURE``).
        ref_grid: ``'eva02'``: the grid coordinates are rescaled to (the pretraining grid).
    """

    def __init__(self, head_dim: int, style: str = 'eva02', temperature: Optional[float] = None,
                 ref_grid: Optional[Grid] = None) -> None:
        super().__init__()
        if style not in ROPE_STYLES:
            raise ValueError(f'unknown rotary style {style!r}; expected one of {ROPE_STYLES}')
        if head_dim % 4:
            raise ValueError(f'rotary position embeddings take a head width that is a multiple '
                             f'of 4, got {head_dim}')
        if style == 'eva02' and ref_grid is None:
            raise ValueError("rotary style 'eva02' rescales coordinates to a reference grid: "
                             "give ref_grid (the pretraining grid)")
        self.head_dim, self.style = head_dim, style
        self.temperature = DEFAULT_TEMPERATURE[style] if temperature is None else temperature
        self.ref_grid = None if ref_grid is None else tuple(ref_grid)

    def _axis_coordinates(self, size: int, axis: int, device: torch.device) -> torch.Tensor:
        if self.style == 'eva02':
            return torch.arange(size, device=device, dtype=torch.float32) / size * \
                self.ref_grid[axis]
        return (torch.arange(size, device=device, dtype=torch.float32) + .5) / size * 2 - 1

    def angles(self, hw: Grid, device: torch.device) -> torch.Tensor:
        """(rows·cols, head_dim) rotation angles of the patches of grid ``hw``, laid out as
        the style rotates channels."""
        bands = self.head_dim // 4
        steps = torch.arange(bands, device=device, dtype=torch.float32)
        if self.style == 'eva02':
            frequencies = 1. / self.temperature ** (steps / bands)
        else:
            frequencies = 2 * math.pi / self.temperature ** (2 * steps / (self.head_dim // 2))
        rows, cols = (self._axis_coordinates(size, axis, device) for axis, size in enumerate(hw))
        grid = torch.stack(torch.meshgrid(rows, cols, indexing='ij'), dim=-1)  # (H, W, 2)
        per_axis = (grid[..., None] * frequencies).flatten(0, 1).flatten(1)  # (N, head_dim/2)
        if self.style == 'eva02':
            return per_axis.repeat_interleave(2, dim=-1)
        return torch.cat([per_axis, per_axis], dim=-1)

    def forward(self, x: torch.Tensor, hw: Grid) -> torch.Tensor:
        """``x`` (..., prefix + rows·cols, head_dim) with its last rows·cols tokens rotated."""
        num_patches = hw[0] * hw[1]
        if x.shape[-2] < num_patches or x.shape[-1] != self.head_dim:
            raise ValueError(f'rotary position embedding of head width {self.head_dim} for a '
                             f'{hw[0]}x{hw[1]} grid got tokens of shape {tuple(x.shape)}')
        angles = self.angles(hw, x.device)
        prefix, patches = x[..., :x.shape[-2] - num_patches, :], x[..., -num_patches:, :]
        rotate = _rotate_pairs if self.style == 'eva02' else _rotate_halves
        rotated = (patches * angles.cos() + rotate(patches) * angles.sin()).to(x.dtype)
        return torch.cat([prefix, rotated], dim=-2) if prefix.shape[-2] else rotated


def eva02_reference_grid(cos: torch.Tensor, sin: torch.Tensor) -> Optional[Grid]:
    """The reference grid EVA-02's rotary tables were built for (its official code keeps them
    as buffers: ``freqs_cos``, ``freqs_sin``, (side², head_dim) for a square grid, rows'
    angles then columns', in interleaved pairs), or None for tables of another shape: the
    first band turns by ``ref / side`` from one row, and from one column, to the next."""
    rows, dim = cos.shape[-2:]
    side = math.isqrt(rows)
    if cos.dim() != 2 or cos.shape != sin.shape or side * side != rows or side < 2 or dim % 4:
        return None
    row_angle = torch.atan2(sin[side, 0], cos[side, 0])
    col_angle = torch.atan2(sin[1, dim // 2], cos[1, dim // 2])
    return tuple(round(float(angle) * side) for angle in (row_angle, col_angle))

