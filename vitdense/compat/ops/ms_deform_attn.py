"""Multi-scale deformable attention (``ms_deform_attn_forward`` / ``_backward``) on the sampler
ViT-Adapter uses, :mod:`vitdense.models.layers.deformable_sampling` (mmcv's kernel formula)."""
from __future__ import annotations

import torch
from torch import Tensor

from vitdense.compat.ops.kernel import atomic_adds_allowed, kernel
from vitdense.models.layers.deformable_sampling import (deformable_sampling, flat_value,
                                                         level_samples)

__all__ = ['ms_deform_attn_backward', 'ms_deform_attn_forward']


@kernel
def ms_deform_attn_forward(value: Tensor, value_spatial_shapes: Tensor,
                           value_level_start_index: Tensor, sampling_locations: Tensor,
                           attention_weights: Tensor, im2col_step: int) -> Tensor:
    """Multi-scale deformable attention, (batch, queries, heads * dims), level by level: the
    largest intermediate is one level's samples.  ``im2col_step`` (the CUDA kernel's batch
    chunk) changes nothing in the result."""
    return deformable_sampling(value, value_spatial_shapes, value_level_start_index,
                               sampling_locations, attention_weights)


@kernel
def ms_deform_attn_backward(value: Tensor, value_spatial_shapes: Tensor,
                            value_level_start_index: Tensor, sampling_locations: Tensor,
                            attention_weights: Tensor, grad_output: Tensor, grad_value: Tensor,
                            grad_sampling_loc: Tensor, grad_attn_weight: Tensor,
                            im2col_step: int) -> None:
    """Adds the gradients by the value, the sampling locations and the attention weights to
    the buffers, level by level: each level's forward is recomputed and differentiated alone,
    so the largest intermediate is one level's samples, as in the forward."""
    batch, keys, heads, dims = value.shape
    grad_share = grad_output.view(batch, -1, heads, dims).transpose(1, 2)
    values = flat_value(value).requires_grad_()
    grad_values = torch.zeros_like(values)
    for level in range(len(value_spatial_shapes)):
        locations, weights = (t[:, :, :, level].detach().requires_grad_()
                              for t in (sampling_locations, attention_weights))
        with torch.enable_grad():
            share = level_samples(values, keys, value_spatial_shapes[level],
                                  value_level_start_index[level], locations, weights)
        with atomic_adds_allowed(value.device):
            by_values, by_locations, by_weights = torch.autograd.grad(
                share, (values, locations, weights), grad_share)
        grad_values += by_values
        grad_sampling_loc[:, :, :, level] += by_locations
        grad_attn_weight[:, :, :, level] += by_weights
    grad_value += grad_values.view(batch, heads, keys, dims).transpose(1, 2)
