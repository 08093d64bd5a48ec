"""Multi-scale deformable attention's sampling (Zhu et al. 2021, Deformable DETR, Eq. 3), by
the arithmetic of mmcv's compiled kernel (``ms_deform_attn_cuda_kernel.cuh``).

The torch-native ``ms_deform_attn`` op that ``vitdense.compat`` serves to mmcv samples
with it (ViT-Adapter's attention keeps ``F.grid_sample``, which was faster and smaller on
CPU: docs/adapter.md).  Each point is read bilinearly at pixel
``(loc_y * H - 0.5, loc_x * W - 0.5)``; a point with ``y <= -1``, ``y >= H``, ``x <= -1`` or
``x >= W`` (or NaN) reads 0 and passes no gradient, as in the kernel (``grid_sample`` passes a
one-sided one at exactly -1); a corner beyond the map reads 0.  The levels' shapes and starts
are tensors read on the device, so nothing waits for it and an exported graph keeps them
symbolic.  This module imports torch alone: the served op loads it without the package.
"""
from __future__ import annotations

import torch
from torch import Tensor

#: where a point read as outside the map is moved: its four corners lie off the map
OUTSIDE = -2.0


def flat_value(value: Tensor) -> Tensor:
    """(batch, keys, heads, dims) as (batch * heads * keys, dims), each head's keys together."""
    return value.permute(0, 2, 1, 3).reshape(-1, value.shape[-1])


def level_samples(values: Tensor, keys: int, shape_hw: Tensor, start: Tensor,
                  locations: Tensor, weights: Tensor) -> Tensor:
    """One level's share of the output, (batch, heads, queries, dims).

    ``values`` is the value (batch * heads * keys, dims), flat (:func:`flat_value`);
    ``locations`` (batch, queries, heads, points, x y) and ``weights`` (batch, queries, heads,
    points) are the level's; ``shape_hw`` (2,) and ``start`` () place the level in the keys.
    """
    batch, _, heads, _ = weights.shape
    rows, cols = shape_hw.unbind()
    height, width = rows.to(locations.dtype), cols.to(locations.dtype)
    loc = locations.permute(0, 2, 1, 3, 4)                        # (B, heads, Q, P, 2)
    y, x = loc[..., 1] * height - 0.5, loc[..., 0] * width - 0.5
    inside = (y > -1) & (x > -1) & (y < height) & (x < width)
    y = torch.where(inside, y, OUTSIDE)
    x = torch.where(inside, x, OUTSIDE)
    y_low, x_low = y.floor(), x.floor()
    frac_y, frac_x = y - y_low, x - x_low
    first = (torch.arange(batch * heads, device=values.device) * keys).view(batch, heads, 1, 1)
    attention = weights.permute(0, 2, 1, 3)                       # (B, heads, Q, P)
    share = 0
    for row, weight_y in ((y_low, 1 - frac_y), (y_low + 1, frac_y)):
        for col, weight_x in ((x_low, 1 - frac_x), (x_low + 1, frac_x)):
            on_map = (row >= 0) & (row <= height - 1) & (col >= 0) & (col <= width - 1)
            key = torch.where(on_map, start + row.long() * cols + col.long(), 0)
            corner = attention * weight_y * weight_x * on_map
            read = values.index_select(0, (first + key).flatten()).view(*key.shape, -1)
            share = share + torch.einsum('bhqp,bhqpd->bhqd', corner, read)
    return share


def deformable_sampling(value: Tensor, shapes: Tensor, starts: Tensor, locations: Tensor,
                        weights: Tensor) -> Tensor:
    """Bilinear samples of ``value`` (B, keys, heads, d; the levels of ``shapes`` (levels, 2:
    h, w), starting at ``starts`` (levels,), one after another) at ``locations`` (B, Q, heads,
    levels, points, x y in [0, 1]), weighted by ``weights`` (B, Q, heads, levels, points) and
    summed: (B, Q, heads · d).  Level by level, so the largest intermediate is one level's
    samples."""
    batch, keys, heads, dims = value.shape
    values = flat_value(value)
    output = sum(level_samples(values, keys, shapes[level], starts[level],
                               locations[:, :, :, level], weights[:, :, :, level])
                 for level in range(len(shapes)))
    return output.permute(0, 2, 1, 3).reshape(batch, -1, heads * dims)
