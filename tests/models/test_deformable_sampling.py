"""Both samplers of multi-scale deformable attention, ViT-Adapter's (``F.grid_sample``) and
the served ``ms_deform_attn`` op's (mmcv's kernel formula), against mmcv's own pure-torch
reference in float64 (the served op's edges: tests/compat/test_mmcv_ext_edges.py)."""
from typing import Callable

import pytest
import torch

from vitdense.models.layers import adapter
from vitdense.models.layers.deformable_sampling import deformable_sampling


def _served(value, shapes, locations, weights) -> torch.Tensor:
    sizes = torch.tensor(shapes)
    starts = torch.tensor([0, *sizes.prod(1).cumsum(0)[:-1].tolist()])
    return deformable_sampling(value, sizes, starts, locations, weights)


@pytest.mark.parametrize('sampler', [adapter.deformable_sampling, _served],
                         ids=['adapter', 'served-op'])
def test_sampling_matches_mmcvs_reference(sampler: Callable[..., torch.Tensor]):
    mmcv_ops = pytest.importorskip('mmcv.ops.multi_scale_deform_attn')
    shapes = [(6, 9), (3, 5), (2, 3)]
    generator = torch.Generator().manual_seed(0)
    value = torch.randn(2, sum(h * w for h, w in shapes), 3, 4, generator=generator,
                        dtype=torch.float64, requires_grad=True)
    # points beyond the maps too: zeros there, as the compiled kernel
    locations = (torch.rand(2, 7, 3, 3, 4, 2, generator=generator, dtype=torch.float64)
                 * 1.4 - .2).requires_grad_()
    weights = torch.rand(2, 7, 3, 3, 4, generator=generator,
                         dtype=torch.float64).requires_grad_()
    ours = sampler(value, shapes, locations, weights)
    reference = mmcv_ops.multi_scale_deformable_attn_pytorch(
        value, torch.tensor(shapes), locations, weights)
    torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)
    upstream = torch.randn(ours.shape, generator=generator, dtype=torch.float64)
    ours_grads = torch.autograd.grad((ours * upstream).sum(), (value, locations, weights))
    reference_grads = torch.autograd.grad((reference * upstream).sum(),
                                          (value, locations, weights))
    for a, b in zip(ours_grads, reference_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
