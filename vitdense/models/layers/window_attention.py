"""Window attention and decomposed relative position bias, as ViTDet uses them on a plain
ViT (Li et al., 2022, §3 "Backbone adaptation"; the bias from MViTv2, Li et al., 2022, §4.1).

A block with a window size attends within non-overlapping windows of ``window`` × ``window``
tokens: the normalised token map is zero-padded at the bottom / right to a multiple of the
window, cut into windows that go through the block's token mixer as a batch, and stitched
back (padding dropped). Padded tokens are keys as any other, as in ViTDet; a few blocks keep
global attention to propagate information across windows.

The relative position bias adds ``q · R_h[i_q - i_k] + q · R_w[j_q - j_k]`` to the attention
logits, with one table per axis of ``2·size - 1`` rows of head width, shared by the heads and
resampled (linearly) to other grids. It reaches attention as extra query and key columns
(one-hot key positions, ``talking_heads.with_logit_terms``), so attention with it stays a
fused kernel that keeps no N × N map. Zero-initialised, the bias is nothing: a model made from an ImageNet checkpoint
starts as that checkpoint.
"""
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .grid import Grid


def window_partition(x: torch.Tensor, window: int) -> tuple[torch.Tensor, Grid]:
    """(B, H, W, C) map -> ((B·windows, window², C) tokens, padded grid (Hp, Wp))."""
    batch, height, width, dims = x.shape
    pad_h = (window - height % window) % window
    pad_w = (window - width % window) % window
    x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
    rows, cols = (height + pad_h) // window, (width + pad_w) // window
    x = x.view(batch, rows, window, cols, window, dims).transpose(2, 3)
    return x.reshape(-1, window * window, dims), (height + pad_h, width + pad_w)


def window_unpartition(windows: torch.Tensor, window: int, padded: Grid,
                       hw: Grid) -> torch.Tensor:
    """Inverse of :func:`window_partition`: (B·windows, window², C) -> (B, H, W, C)."""
    rows, cols = padded[0] // window, padded[1] // window
    x = windows.view(-1, rows, cols, window, window, windows.shape[-1]).transpose(2, 3)
    return x.reshape(x.shape[0], *padded, -1)[:, :hw[0], :hw[1]]


def window_attention(mixer: Callable, x: torch.Tensor, hw: Grid, window: int) -> torch.Tensor:
    """``mixer`` (tokens, grid) -> tokens applied within windows of the (B, rows·cols, C)
    patch tokens ``x`` on grid ``hw``; each window is a (window, window) grid to the mixer."""
    if x.shape[-2] != hw[0] * hw[1]:
        raise ValueError(f'window attention takes patch tokens only: {x.shape[-2]} tokens '
                         f'for a {hw[0]}x{hw[1]} grid (a class token in the trunk? build the '
                         f'dense backbone with dense_class_token=False)')
    windows, padded = window_partition(x.view(x.shape[0], *hw, x.shape[-1]), window)
    out = mixer(windows, (window, window))
    return window_unpartition(out, window, padded, hw).reshape(x.shape[0], -1, out.shape[-1])


def resample_relative_table(table: torch.Tensor, length: int) -> torch.Tensor:
    """A (L, d) table of relative offsets linearly resampled to ``length`` rows."""
    if table.shape[0] == length:
        return table
    return F.interpolate(table.t()[None], size=length, mode='linear')[0].t()


def relative_table_lookup(table: torch.Tensor, q_size: int, k_size: int) -> torch.Tensor:
    """(q_size, k_size, d): the table's row for each query-key offset along one axis; grids
    of different lengths are compared in the coordinates of the longer one (MViTv2)."""
    table = resample_relative_table(table, 2 * max(q_size, k_size) - 1)
    q_coords = torch.arange(q_size, device=table.device)[:, None] * max(k_size / q_size, 1.)
    k_coords = torch.arange(k_size, device=table.device)[None, :] * max(q_size / k_size, 1.)
    offsets = q_coords - k_coords + (k_size - 1) * max(q_size / k_size, 1.)
    return table[offsets.long()]


class DecomposedRelativePosition(nn.Module):
    """The decomposed relative position bias of one attention layer (MViTv2 §4.1, ViTDet):
    ``height`` and ``width`` tables of (2·size - 1, head_dims), zero-initialised."""

    def __init__(self, head_dims: int, grid: Grid, zero_init: bool = True) -> None:
        super().__init__()
        self.height = nn.Parameter(torch.zeros(2 * grid[0] - 1, head_dims))
        self.width = nn.Parameter(torch.zeros(2 * grid[1] - 1, head_dims))
        if not zero_init:
            nn.init.trunc_normal_(self.height, std=.02)
            nn.init.trunc_normal_(self.width, std=.02)

    def forward(self, q: torch.Tensor, hw: Grid) -> tuple[torch.Tensor, torch.Tensor]:
        """The bias as logit terms ``q_t·k_t`` for (unscaled) queries (..., N, d) of the
        patches of grid ``hw``: query terms ``[q·R_h, q·R_w]`` (..., N, rows + cols) and key
        terms ``[one-hot row, one-hot column]`` (N, rows + cols). Attention takes them as
        extra columns of its queries and keys instead of an (N, N) mask, so a fused kernel
        keeps no N × N tensor."""
        rows, cols = hw
        if q.shape[-2] != rows * cols:
            raise ValueError(f'relative position bias takes patch tokens only: '
                             f'{q.shape[-2]} queries for a {rows}x{cols} grid')
        grid_q = q.unflatten(-2, hw)
        rel_h = torch.einsum('...hwc,hkc->...hwk', grid_q,
                             relative_table_lookup(self.height, rows, rows).to(q.dtype))
        rel_w = torch.einsum('...hwc,wkc->...hwk', grid_q,
                             relative_table_lookup(self.width, cols, cols).to(q.dtype))
        eye = torch.eye(max(rows, cols), dtype=q.dtype, device=q.device)
        key_terms = torch.cat([eye[:rows, :rows].repeat_interleave(cols, 0),
                               eye[:cols, :cols].repeat(rows, 1)], dim=-1)
        return torch.cat([rel_h.flatten(-3, -2), rel_w.flatten(-3, -2)], dim=-1), key_terms
