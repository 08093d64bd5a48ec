"""Multi-scale deformable attention's sampling (Zhu et al. 2021, Deformable DETR, Eq. 3), by
the arithmetic of mmcv's compiled kernel (``ms_deform_attn_cuda_kernel.cuh``).

One sampler serves ViT-Adapter's :class:`~vitdense.models.layers.adapter.
MultiScaleDeformableAttention` and the torch-native ``ms_deform_attn`` op that
``vitdense.compat`` serves to mmcv.  Each point is read bilinearly at pixel
``(loc_y * H - 0.5, loc_x * W - 0.5)``; a point with ``y <= -1``, ``y >= H``, ``x <= -1`` or
``x >= W`` (or NaN) reads 0 and passes no gradient, as in the kernel (``grid_sample`` passes a
one-sided one at exactly -1); a corner beyond the map reads 0.  Each point's four corners
are rows of the flat value with a weight each (attention × bilinear), summed by
``F.embedding_bag``: no sample is kept for the backward, only a row index and a weight per
corner: ViT-Adapter's attention runs faster and keeps less than with ``grid_sample`` on
CPU (docs/adapter.md).  The levels' shapes and starts are tensors read on the device, so
nothing waits for it and an exported graph keeps them symbolic.  This module imports torch
alone: the served op loads it without the package.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

#: where a point read as outside the map is moved: its four corners lie off the map
OUTSIDE = -2.0


def level_sizes(shapes: Sequence[tuple[int, int]],
                device: torch.device) -> tuple[Tensor, Tensor]:
    """The levels' (h, w) as a (levels, 2) tensor and each level's first key (levels,), made
    of the sizes one by one, so that an exported graph keeps symbolic sizes symbolic (a
    tensor made of the list would fix them)."""
    sizes = torch.stack([torch.stack([torch.full((), size, device=device) for size in shape])
                         for shape in shapes])
    ends = sizes.prod(1).cumsum(0)
    return sizes, torch.cat([ends.new_zeros(1), ends[:-1]])


def corners(shapes: Tensor, starts: Tensor, locations: Tensor, weights: Tensor,
            keys: int) -> tuple[Tensor, Tensor]:
    """Every point's four corners as rows of the value flattened to (batch * heads * keys,
    dims), each head's keys together, and their weights (the point's attention × its
    bilinear weight; 0 off the map and for a point outside): both (batch, heads, queries,
    levels * points * 4).

    ``locations`` (batch, queries, heads, levels, points, x y) and ``weights`` (batch,
    queries, heads, levels, points) as in :func:`deformable_sampling`.
    """
    batch, _, heads = locations.shape[:3]
    rows, cols = shapes[:, :1], shapes[:, 1:]                     # (levels, 1): by point
    height, width = rows.to(locations.dtype), cols.to(locations.dtype)
    loc = locations.permute(0, 2, 1, 3, 4, 5)                     # (B, heads, Q, L, P, 2)
    y, x = loc[..., 1] * height - 0.5, loc[..., 0] * width - 0.5
    inside = (y > -1) & (x > -1) & (y < height) & (x < width)
    y = torch.where(inside, y, OUTSIDE)
    x = torch.where(inside, x, OUTSIDE)
    # floor passes no gradient: detached, the corners' rows build no graph
    y_low, x_low = y.detach().floor(), x.detach().floor()
    # the corners' two rows and two columns, each weighing 0 off the map, where it reads a
    # row on the map instead (any: its weight is 0)
    row = torch.stack([y_low, y_low + 1], -1)                    # (B, heads, Q, L, P, 2)
    col = torch.stack([x_low, x_low + 1], -1)
    weight_y = (torch.stack([1 - (y - y_low), y - y_low], -1)
                * ((row >= 0) & (row <= height[..., None] - 1)))
    weight_x = (torch.stack([1 - (x - x_low), x - x_low], -1)
                * ((col >= 0) & (col <= width[..., None] - 1)))
    row = torch.clamp(row, min=0).minimum(height[..., None] - 1).long()
    col = torch.clamp(col, min=0).minimum(width[..., None] - 1).long()
    first = (torch.arange(batch * heads, device=locations.device) * keys).view(
        batch, heads, 1, 1, 1, 1)
    start = first + starts.view(-1, 1, 1) + row * cols.view(-1, 1, 1)
    index = start[..., :, None] + col[..., None, :]             # corner (i, j): row i, col j
    attention = weights.permute(0, 2, 1, 3, 4)[..., None]        # (B, heads, Q, L, P, 1)
    corner_weights = (attention * weight_y)[..., :, None] * weight_x[..., None, :]
    return index.flatten(3), corner_weights.flatten(3)


def level_samples(values: Tensor, keys: int, shapes: Tensor, starts: Tensor,
                  locations: Tensor, weights: Tensor) -> Tensor:
    """The weighted sum of the samples on the levels of ``shapes`` and ``starts``,
    (batch * heads * queries, dims), read from ``values``, the value flattened to (batch *
    heads * keys, dims), each head's keys together; ``locations`` and ``weights`` as in
    :func:`deformable_sampling`, of these levels, all in ``values``' dtype."""
    batch, queries, heads = locations.shape[:3]
    index, corner_weights = corners(shapes, starts, locations, weights, keys)
    index = index.reshape(batch * heads * queries, -1)
    corner_weights = corner_weights.reshape(batch * heads * queries, -1)
    if torch.compiler.is_exporting():
        # ONNX has no weighted bag sum (onnxscript's embedding_bag loops over the bags)
        return (values[index] * corner_weights[..., None]).sum(1)
    return F.embedding_bag(index, values, mode='sum', per_sample_weights=corner_weights)


def deformable_sampling(value: Tensor, shapes: Tensor, starts: Tensor, locations: Tensor,
                        weights: Tensor) -> Tensor:
    """Bilinear samples of ``value`` (B, keys, heads, d; the levels of ``shapes`` (levels, 2:
    h, w), starting at ``starts`` (levels,), one after another) at ``locations`` (B, Q, heads,
    levels, points, x y in [0, 1]), weighted by ``weights`` (B, Q, heads, levels, points) and
    summed: (B, Q, heads · d), in the widest dtype of the three (under autocast the value is
    half precision and the locations and weights float32, which the sum keeps).  Level by
    level, so the largest intermediate is one level's corners."""
    batch, keys, heads, dims = value.shape
    queries = locations.shape[1]
    dtype = torch.promote_types(value.dtype,
                                torch.promote_types(locations.dtype, weights.dtype))
    values = value.to(dtype).permute(0, 2, 1, 3).reshape(-1, dims)
    output = sum(level_samples(values, keys, shapes[level:level + 1], starts[level:level + 1],
                               locations[:, :, :, level:level + 1].to(dtype),
                               weights[:, :, :, level:level + 1].to(dtype))
                 for level in range(len(shapes)))
    return output.view(batch, heads, queries, dims).transpose(1, 2).reshape(
        batch, queries, heads * dims)
