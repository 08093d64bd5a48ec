"""On a CUDA device: talking heads on every GPU path, GPSA, and the mmcv ops served under
mmcv-lite (nms, RoIAlign, focal losses, deformable attention and convolutions), against
the written-out maps and the CPU results, in float32 and under float16 /
bfloat16 autocast. The fused SDPA kernels are forced (a fall-back to the math kernel fails).
Skipped without a GPU; docs/gpu_report.md says how to run it on a lent one."""
from typing import Optional

import mmcv.ops
import pytest
import torch

from benchmarks.gpu_report import fused_attention
from test_fused_attention import (GATE_HALF_TOLERANCE, HALF_TOLERANCE, TOLERANCE,
                                  assert_matches, gpsa_case, talking_heads_case,
                                  written_out_talking_heads)
from vitdense.models.layers.talking_heads import available_paths, talking_heads_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason='needs a CUDA device (docs/gpu_report.md: on a GPU)')
CUDA = torch.device('cuda')
DTYPES = [None, torch.float16, torch.bfloat16]  # None: float32
#: the served ops in half precision sum products rounded in it (RoIAlign: 5.7e-3 of the
#: scale measured in float16 on a CPU); bfloat16 has 3 fewer bits (RoIAlign computes it in
#: float32 and rounds the results alone)
OPS_HALF_TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 8e-2}


def cuda_grads(out: torch.Tensor, inputs: dict) -> dict:
    """The output and the gradients of a fixed random projection of it, in float32."""
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device)
    values = torch.autograd.grad((out.float() * probe).sum(), list(inputs.values()))
    return dict(out=out.detach().float(), **{f'd{n}': g.float() for n, g in zip(inputs, values)})


def run_talking_heads(hw, path: Optional[str], dtype: Optional[torch.dtype]) -> dict:
    """One talking-heads call on CUDA: ``path`` of the library, None the written-out maps."""
    case = talking_heads_case(hw, rel_pos=False, class_token=True)
    q, k, v = (case[n].detach().to(CUDA).requires_grad_() for n in ('q', 'k', 'v'))
    mix_logits, mix_weights = (mix.to(CUDA) for mix in case['mixes'])
    inputs = dict(q=q, k=k, v=v, mix_logits=mix_logits.weight, mix_weights=mix_weights.weight,
                  bias_weights=mix_weights.bias)
    with torch.autocast('cuda', dtype=dtype or torch.float16, enabled=dtype is not None):
        if path is None:
            out = written_out_talking_heads(q, k, v, 8 ** -0.5, mix_logits, mix_weights)
        else:
            with fused_attention():
                out = talking_heads_attention(q, k, v, 8 ** -0.5, mix_logits, mix_weights,
                                              path=path)
    return cuda_grads(out, inputs)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('path', [p for p in available_paths(CUDA) if p != 'maps'])
def test_talking_heads_on_cuda_equal_the_written_out_maps(path, dtype):
    reference = run_talking_heads((5, 7), None, None)
    assert_matches(run_talking_heads((5, 7), path, dtype), reference,
                   HALF_TOLERANCE.get(dtype, TOLERANCE))


@pytest.mark.parametrize('dtype', DTYPES)
def test_gpsa_on_cuda_equals_its_written_out_weights(dtype):
    hw = (5, 7)
    mixer = gpsa_case(hw).to(CUDA)
    x = torch.randn(2, 35, 24, device=CUDA, requires_grad=True)
    inputs = dict(x=x, **{n: p for n, p in mixer.named_parameters() if n != 'pos_proj.bias'})
    with torch.autocast('cuda', dtype=dtype or torch.float16, enabled=dtype is not None), \
            fused_attention():
        ours = cuda_grads(mixer(x, hw), inputs)
    (values,) = mixer.v(x).view(2, 35, 1, 3, 8).permute(2, 0, 3, 1, 4)
    weights = mixer.attention_weights(x, hw)
    theirs = cuda_grads(mixer.proj((weights @ values).transpose(1, 2).flatten(-2)), inputs)
    assert_matches({'dgating': ours.pop('dgating')}, {'dgating': theirs.pop('dgating')},
                   GATE_HALF_TOLERANCE.get(dtype, TOLERANCE))
    assert_matches(ours, theirs, HALF_TOLERANCE.get(dtype, TOLERANCE))


def test_served_nms_keeps_on_cuda_what_it_keeps_on_cpu():
    gen = torch.Generator().manual_seed(0)
    xy = torch.rand(500, 2, generator=gen) * 100
    boxes = torch.cat([xy, xy + torch.rand(500, 2, generator=gen) * 30], 1)
    scores = torch.rand(500, generator=gen)
    for offset in (0, 1):
        kept_cpu = mmcv.ops.nms(boxes, scores, 0.5, offset=offset)[1]
        kept_cuda = mmcv.ops.nms(boxes.to(CUDA), scores.to(CUDA), 0.5, offset=offset)[1]
        assert torch.equal(kept_cuda.cpu(), kept_cpu)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float16, torch.bfloat16])
def test_served_roi_align_on_cuda_equals_cpu_float32(dtype):
    """Values and gradients of CUDA in ``dtype`` against float32 on a CPU, on the same
    inputs (rounded to ``dtype`` first)."""
    feats = torch.randn(2, 8, 24, 32, generator=torch.Generator().manual_seed(0)).to(dtype)
    rois = torch.tensor([[0, 2.0, 3.0, 20.0, 14.0], [1, 5.3, 1.7, 9.9, 30.2],
                         [0, -6.0, -4.0, 5.0, 6.0], [1, 0.0, 0.0, 31.0, 23.0]]).to(dtype)
    grad = torch.randn(4, 8, 7, 7, generator=torch.Generator().manual_seed(1)).to(dtype)

    def run(device: str, dtype: torch.dtype) -> dict:
        x = feats.to(device, dtype).clone().requires_grad_()
        out = mmcv.ops.roi_align(x, rois.to(device, dtype), (7, 7), 0.5, 2, 'avg', True)
        out.backward(grad.to(device, dtype))
        return dict(out=out.detach().float().cpu(), dfeats=x.grad.float().cpu())
    tolerance = TOLERANCE if dtype == torch.float32 else OPS_HALF_TOLERANCE[dtype]
    assert_matches(run('cuda', dtype), run('cpu', torch.float32), tolerance)


def _random(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _deform_attention_inputs() -> dict:
    shapes = torch.tensor([[6, 8], [3, 4]])
    weights = _random(2, 5, 2, 2, 2, seed=3).flatten(-2).softmax(-1).view(2, 5, 2, 2, 2)
    return dict(value=_random(2, 60, 2, 8, seed=1), spatial_shapes=shapes,
                level_start_index=torch.tensor([0, 48]),
                sampling_locations=torch.rand(2, 5, 2, 2, 2, 2,
                                              generator=torch.Generator().manual_seed(2)),
                attention_weights=weights)


def _deform_attention(value, spatial_shapes, level_start_index, sampling_locations,
                      attention_weights):
    from mmcv.ops.multi_scale_deform_attn import MultiScaleDeformableAttnFunction
    return MultiScaleDeformableAttnFunction.apply(
        value, spatial_shapes, level_start_index, sampling_locations, attention_weights, 64)


#: each served op through mmcv's own wrapper: (function, inputs, the inputs with gradients)
SERVED_OPS = {
    'sigmoid_focal_loss': (
        lambda pred, target: mmcv.ops.sigmoid_focal_loss(pred, target, 2.0, 0.25, None, 'none'),
        lambda: dict(pred=_random(16, 5, seed=0), target=torch.arange(16) % 5), ('pred',)),
    'softmax_focal_loss': (
        # summed: mmcv's wrapper cannot take a per-sample gradient (its reduction 'none')
        lambda pred, target: mmcv.ops.softmax_focal_loss(pred, target, 2.0, 0.25, None, 'sum'),
        lambda: dict(pred=_random(16, 5, seed=0), target=torch.arange(16) % 5), ('pred',)),
    'ms_deform_attn': (_deform_attention, _deform_attention_inputs,
                       ('value', 'sampling_locations', 'attention_weights')),
    'deform_conv': (
        lambda x, offset, weight: mmcv.ops.deform_conv2d(x, offset, weight, 1, 1),
        lambda: dict(x=_random(2, 4, 7, 9, seed=0), offset=_random(2, 18, 7, 9, seed=1),
                     weight=_random(6, 4, 3, 3, seed=2)), ('x', 'offset', 'weight')),
    'modulated_deform_conv': (
        lambda x, offset, mask, weight, bias: mmcv.ops.modulated_deform_conv2d(
            x, offset, mask, weight, bias, 1, 1, 1, 1, 1),
        lambda: dict(x=_random(2, 4, 7, 9, seed=0), offset=_random(2, 18, 7, 9, seed=1),
                     mask=_random(2, 9, 7, 9, seed=2).sigmoid(),
                     weight=_random(6, 4, 3, 3, seed=3), bias=_random(6, seed=4)),
        ('x', 'offset', 'mask', 'weight', 'bias')),
}


def run_served(name: str, device: str, dtype: torch.dtype, rounded_to: torch.dtype) -> dict:
    """The op in ``dtype`` on inputs rounded to ``rounded_to``: its output and the gradients
    of a fixed random projection of it, in float32."""
    function, make_inputs, with_grad = SERVED_OPS[name]
    inputs = {key: (value.to(rounded_to).to(device, dtype) if value.is_floating_point()
                    else value.to(device)).requires_grad_(key in with_grad)
              for key, value in make_inputs().items()}
    out = function(**inputs)
    probe = _random(*out.shape, seed=9).to(device)
    grads = torch.autograd.grad((out.float() * probe).sum(), [inputs[k] for k in with_grad])
    return dict(out=out.detach().float().cpu(),
                **{f'd{k}': g.float().cpu() for k, g in zip(with_grad, grads)})


@pytest.mark.parametrize('dtype', [torch.float32, torch.float16])  # what mmcv's kernels take
@pytest.mark.parametrize('name', list(SERVED_OPS))
def test_served_op_on_cuda_equals_cpu_float32(name, dtype):
    """Values and gradients on CUDA in ``dtype`` against float32 on a CPU (which
    tests/compat/test_mmcv_ext.py checks against mmcv's references), same inputs. In float16
    the offsets' gradient of a deformable convolution is left out: it is the difference of
    neighbouring pixels at sample points whose position float16 rounds (by 1/128 of a pixel
    at 8 pixels), across pixel borders."""
    ours, reference = (run_served(name, 'cuda', dtype, dtype),
                       run_served(name, 'cpu', torch.float32, dtype))
    if dtype == torch.float16 and 'doffset' in ours:
        del ours['doffset'], reference['doffset']
    tolerance = TOLERANCE if dtype == torch.float32 else OPS_HALF_TOLERANCE[dtype]
    assert_matches(ours, reference, tolerance)
