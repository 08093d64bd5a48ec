"""Multi-scale deformable attention (``ms_deform_attn_forward`` / ``_backward``) on the sampler
ViT-Adapter uses, :mod:`vitdense.models.layers.deformable_sampling` (mmcv's kernel formula)."""
from __future__ import annotations

import torch
from torch import Tensor

from vitdense.compat.ops.kernel import kernel
from vitdense.models.layers.deformable_sampling import deformable_sampling

__all__ = ['ms_deform_attn_backward', 'ms_deform_attn_forward']


@kernel
def ms_deform_attn_forward(value: Tensor, value_spatial_shapes: Tensor,
                           value_level_start_index: Tensor, sampling_locations: Tensor,
                           attention_weights: Tensor, im2col_step: int) -> Tensor:
    """Multi-scale deformable attention, (batch, queries, heads * dims).  ``im2col_step``
    (the CUDA kernel's batch chunk) changes nothing in the result."""
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
    so the largest intermediate is one level's corners."""
    value = value.detach().requires_grad_()
    for level in range(len(value_spatial_shapes)):
        locations, weights = (t[:, :, :, level:level + 1].detach().requires_grad_()
                              for t in (sampling_locations, attention_weights))
        with torch.enable_grad():
            share = deformable_sampling(value, value_spatial_shapes[level:level + 1],
                                        value_level_start_index[level:level + 1], locations,
                                        weights)
        by_value, by_locations, by_weights = torch.autograd.grad(
            share, (value, locations, weights), grad_output)
        grad_value += by_value
        grad_sampling_loc[:, :, :, level:level + 1] += by_locations
        grad_attn_weight[:, :, :, level:level + 1] += by_weights
