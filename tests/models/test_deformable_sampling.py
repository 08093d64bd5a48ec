"""The deformable sampling that ViT-Adapter's attention and the served ``ms_deform_attn`` op
share, against mmcv's own pure-torch reference in float64, as it runs and as an exported
graph computes it; what its backward keeps (the served op's edges:
tests/compat/test_mmcv_ext_edges.py)."""
import pytest
import torch

from vitdense.models.layers.deformable_sampling import deformable_sampling, level_sizes

SHAPES = [(6, 9), (3, 5), (2, 3)]


def _inputs(dtype: torch.dtype = torch.float64, queries: int = 7, dims: int = 4
            ) -> list[torch.Tensor]:
    """Value, sampling locations (beyond the maps too) and attention weights: 2 images, 3
    heads, 4 points."""
    generator = torch.Generator().manual_seed(0)
    value = torch.randn(2, sum(h * w for h, w in SHAPES), 3, dims, generator=generator,
                        dtype=dtype)
    locations = torch.rand(2, queries, 3, 3, 4, 2, generator=generator, dtype=dtype) * 1.4 - .2
    weights = torch.rand(2, queries, 3, 3, 4, generator=generator, dtype=dtype)
    return [t.requires_grad_() for t in (value, locations, weights)]


@pytest.mark.parametrize('exporting', [False, True], ids=['bag-sum', 'exported-graph'])
def test_sampling_matches_mmcvs_reference(exporting, monkeypatch):
    mmcv_ops = pytest.importorskip('mmcv.ops.multi_scale_deform_attn')
    monkeypatch.setattr(torch.compiler, 'is_exporting', lambda: exporting)
    value, locations, weights = _inputs()
    sizes, starts = level_sizes(SHAPES, value.device)
    ours = deformable_sampling(value, sizes, starts, locations, weights)
    reference = mmcv_ops.multi_scale_deformable_attn_pytorch(
        value, torch.tensor(SHAPES), locations, weights)
    torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)
    upstream = torch.randn(ours.shape, generator=torch.Generator().manual_seed(1),
                           dtype=torch.float64)
    ours_grads = torch.autograd.grad((ours * upstream).sum(), (value, locations, weights))
    reference_grads = torch.autograd.grad((reference * upstream).sum(),
                                          (value, locations, weights))
    for a, b in zip(ours_grads, reference_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_backward_keeps_no_samples():
    """What the forward saves for the backward is the value and a few numbers per corner, never
    a (queries, points, channels) block of samples: wide channels add nothing to it."""
    value, locations, weights = _inputs(torch.float32, queries=50, dims=64)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        sizes, starts = level_sizes(SHAPES, value.device)
        deformable_sampling(value, sizes, starts, locations, weights)
    samples = locations[..., 0].numel() * value.shape[-1]
    assert saved and max(t.numel() for t in saved) < samples / 4


def test_under_autocast_the_samples_are_summed_in_float32():
    """ViT-Adapter under autocast: the value comes in bfloat16, the locations and weights in
    float32, and the sum is taken in float32."""
    value, locations, weights = _inputs(torch.float32)
    sizes, starts = level_sizes(SHAPES, value.device)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = deformable_sampling(value.bfloat16(), sizes, starts, locations, weights)
    assert out.dtype == torch.float32
    reference = deformable_sampling(value.bfloat16().float(), sizes, starts, locations,
                                    weights)
    torch.testing.assert_close(out, reference, rtol=1e-6, atol=1e-6)
