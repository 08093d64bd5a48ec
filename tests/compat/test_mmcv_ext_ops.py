"""The torch-native focal losses, multi-scale deformable attention and (modulated) deformable
convolutions, called through mmcv's compiled-op entry points on CPU tensors (the branch mmcv
takes on a GPU): values and gradients equal mmcv's or mmdet's pure-torch references, or the
compiled kernels' formulas written out here, in float64 and float32 and under autocast."""
from __future__ import annotations

import mmcv.ops
import pytest
import torch
import torch.nn.functional as F
from mmcv.ops.multi_scale_deform_attn import (MultiScaleDeformableAttnFunction,
                                              multi_scale_deformable_attn_pytorch)
from mmdet.models.losses.focal_loss import py_sigmoid_focal_loss

from vitdense.compat.ops import deform_conv

FORWARD_RTOL = 1e-5
GRADIENT_RTOL = 1e-4
INJECTED_ERROR = 1e-3   # 0.1 %


def relative_error(served: torch.Tensor, reference: torch.Tensor) -> float:
    """Largest absolute difference over the reference's largest magnitude."""
    scale = reference.detach().abs().max().clamp(min=torch.finfo(reference.dtype).tiny)
    return float((served.detach() - reference.detach()).abs().max() / scale)


def assert_matches(what: str, served: torch.Tensor, reference: torch.Tensor,
                   rtol: float) -> None:
    """``served`` equals ``reference`` within ``rtol`` (relative to its largest magnitude), and
    the same served result with 0.1 % added to its largest element would not."""
    assert served.shape == reference.shape and served.dtype == reference.dtype, what
    error = relative_error(served, reference)
    assert error <= rtol, f'{what}: relative error {error:.2e} > {rtol:.0e}'
    injected = served.detach().clone().flatten()
    largest = injected.abs().argmax()
    injected[largest] += INJECTED_ERROR * injected[largest].abs()
    assert relative_error(injected.view_as(served), reference) > rtol, \
        f'{what}: a 0.1 % error would pass'


def assert_op_matches(served_op, reference_op, inputs: list[torch.Tensor],
                      names: list[str]) -> None:
    """Forward of both on copies of ``inputs``, then the gradients by every input that
    requires one, for the same random output gradient."""
    served_in = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    ref_in = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    served, reference = served_op(*served_in), reference_op(*ref_in)
    assert_matches('forward', served, reference, FORWARD_RTOL)
    grad = torch.randn(served.shape, generator=torch.Generator().manual_seed(1)).to(served)
    wanted = [i for i, t in enumerate(inputs) if t.requires_grad]
    served_grads = torch.autograd.grad(served, [served_in[i] for i in wanted], grad)
    ref_grads = torch.autograd.grad(reference, [ref_in[i] for i in wanted], grad)
    for i, s, r in zip(wanted, served_grads, ref_grads):
        assert_matches(f'gradient by {names[i]}', s, r, GRADIENT_RTOL)


def test_comparison_rejects_an_injected_error():
    reference = torch.linspace(-2, 3, 50, dtype=torch.float64)
    assert_matches('identical', reference.clone(), reference, FORWARD_RTOL)
    with pytest.raises(AssertionError, match='relative error'):
        assert_matches('off by 0.1 %', reference * (1 + INJECTED_ERROR), reference,
                       GRADIENT_RTOL)


DTYPES = [torch.float64, torch.float32]


# --- focal losses ---------------------------------------------------------------------------

def _logits(dtype: torch.dtype, n: int = 40, classes: int = 6) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(n, classes, generator=gen)).to(dtype).requires_grad_()
    target = torch.randint(0, classes + 1, (n,), generator=gen)   # classes: background
    return logits, target


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('gamma, alpha', [(2.0, 0.25), (1.5, 0.6)])
def test_sigmoid_focal_loss_equals_mmdet_pytorch_focal_loss(dtype, gamma, alpha):
    logits, target = _logits(dtype)
    one_hot = F.one_hot(target, logits.shape[1] + 1)[:, :-1]
    assert_op_matches(
        lambda x: mmcv.ops.sigmoid_focal_loss(x, target, gamma, alpha, None, 'none'),
        lambda x: py_sigmoid_focal_loss(x, one_hot, None, gamma, alpha, 'none'),
        [logits], ['logits'])


def test_sigmoid_focal_loss_class_weight_and_reductions():
    logits, target = _logits(torch.float64)
    target = target.clamp(max=logits.shape[1] - 1)
    weight = torch.rand(logits.shape[1], dtype=torch.float64)
    one_hot = F.one_hot(target, logits.shape[1])
    assert_op_matches(
        lambda x: mmcv.ops.sigmoid_focal_loss(x, target, 2.0, 0.25, weight, 'mean'),
        lambda x: (py_sigmoid_focal_loss(x, one_hot, None, 2.0, 0.25, 'none')
                   * weight[target, None]).sum() / len(x),
        [logits], ['logits'])
    with pytest.raises(ValueError, match='class weight has 6 entries.*weight=None'):
        mmcv.ops.sigmoid_focal_loss(logits, target.fill_(6), 2.0, 0.25, weight, 'sum')


def _softmax_focal_reference(logits: torch.Tensor, target: torch.Tensor, gamma: float,
                             alpha: float) -> torch.Tensor:
    """-alpha (1 - p)^gamma log p of the target class; rows with a negative target count 0."""
    labelled = target >= 0
    log_p = logits.log_softmax(1).gather(1, target.clamp(min=0)[:, None])[:, 0]
    loss = -alpha * (1 - log_p.exp()).pow(gamma) * log_p
    return torch.where(labelled, loss, torch.zeros_like(loss))


@pytest.mark.parametrize('dtype', DTYPES)
def test_softmax_focal_loss_equals_the_formula(dtype):
    logits, target = _logits(dtype)
    target = torch.where(target == logits.shape[1], -1, target)   # negative: ignored rows
    # (mmcv's backward takes a scalar output gradient: reduction 'mean' or 'sum')
    assert_op_matches(
        lambda x: mmcv.ops.softmax_focal_loss(x, target, 2.0, 0.25, None, 'mean'),
        lambda x: _softmax_focal_reference(x, target, 2.0, 0.25).sum() / len(x), [logits],
        ['logits'])
    weight = torch.rand(logits.shape[1], generator=torch.Generator().manual_seed(3)).to(dtype)
    assert_op_matches(
        lambda x: mmcv.ops.softmax_focal_loss(x, target, 1.0, 0.5, weight, 'sum'),
        lambda x: (_softmax_focal_reference(x, target, 1.0, 0.5)
                   * weight[target.clamp(min=0)]).sum(), [logits], ['logits'])
    with pytest.raises(ValueError, match='a target is 6 but there are 6 classes'):
        mmcv.ops.softmax_focal_loss(logits, target.clamp(min=0) + 1, 2.0, 0.25, None, 'sum')


def test_focal_loss_under_autocast_keeps_the_logits_dtype():
    logits, target = _logits(torch.float32)
    half = logits.detach().half().requires_grad_()
    with torch.autocast('cpu', dtype=torch.float16):
        loss = mmcv.ops.sigmoid_focal_loss(half, target, 2.0, 0.25, None, 'sum')
    loss.backward()
    assert loss.dtype == half.grad.dtype == torch.float16
    full = half.detach().float().requires_grad_()
    one_hot = F.one_hot(target, logits.shape[1] + 1)[:, :-1]
    reference = py_sigmoid_focal_loss(full, one_hot, None, 2.0, 0.25, 'sum')
    reference.backward()
    assert relative_error(loss.float(), reference) < 2e-3
    assert relative_error(half.grad.float(), full.grad) < 2e-3


# --- multi-scale deformable attention -------------------------------------------------------

SHAPES = torch.tensor([[7, 9], [4, 5], [2, 3]])
STARTS = torch.tensor([0, 63, 83])


def _attention_inputs(dtype: torch.dtype, batch: int = 2, queries: int = 11, heads: int = 2,
                      dims: int = 4, points: int = 3) -> list[torch.Tensor]:
    """Value, sampling locations (some beyond the map's edges) and attention weights."""
    gen = torch.Generator().manual_seed(0)
    levels, keys = len(SHAPES), int(SHAPES.prod(1).sum())
    value = torch.randn(batch, keys, heads, dims, generator=gen)
    locations = torch.rand(batch, queries, heads, levels, points, 2, generator=gen) * 1.3 - 0.15
    weights = torch.rand(batch, queries, heads, levels, points, generator=gen).softmax(-1)
    return [t.to(dtype).requires_grad_() for t in (value, locations, weights)]


@pytest.mark.parametrize('dtype', DTYPES)
def test_ms_deform_attn_equals_mmcv_pytorch_path(dtype):
    assert_op_matches(
        lambda v, loc, w: MultiScaleDeformableAttnFunction.apply(v, SHAPES, STARTS, loc, w, 64),
        lambda v, loc, w: multi_scale_deformable_attn_pytorch(v, SHAPES, loc, w),
        _attention_inputs(dtype), ['value', 'sampling locations', 'attention weights'])


def test_ms_deform_attn_under_autocast_runs_in_the_value_dtype():
    value, locations, weights = _attention_inputs(torch.float32)
    with torch.autocast('cpu', dtype=torch.float16):
        out = MultiScaleDeformableAttnFunction.apply(value.half(), SHAPES, STARTS, locations,
                                                     weights, 64)
    assert out.dtype == torch.float16
    reference = multi_scale_deformable_attn_pytorch(value.half().float(), SHAPES,
                                                    locations.half().float(),
                                                    weights.half().float())
    assert relative_error(out.float(), reference) < 2e-3


# --- deformable convolution -----------------------------------------------------------------

def _deform_conv_reference(x: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor | None,
                           weight: torch.Tensor, bias: torch.Tensor | None, stride: int,
                           padding: int, dilation: int, groups: int,
                           deform_groups: int) -> torch.Tensor:
    """The compiled kernels' formula: each kernel tap reads the input bilinearly at its grid
    position plus its offset (zero beyond the edges), scaled by the mask, then the taps are
    summed with the weights.  Sampling is ``grid_sample`` with aligned corners."""
    batch, channels, height, width = x.shape
    out_channels, _, kh, kw = weight.shape
    out_h, out_w = offset.shape[-2:]
    offset = offset.view(batch, deform_groups, kh * kw, 2, out_h, out_w)
    rows = (torch.arange(out_h, dtype=x.dtype) * stride - padding)[:, None]
    cols = (torch.arange(out_w, dtype=x.dtype) * stride - padding)[None, :]
    taps = []
    for tap in range(kh * kw):
        i, j = divmod(tap, kw)
        y = rows + i * dilation + offset[:, :, tap, 0]   # (batch, deform groups, H', W')
        x_ = cols + j * dilation + offset[:, :, tap, 1]
        grid = torch.stack([2 * x_ / (width - 1) - 1, 2 * y / (height - 1) - 1], -1)
        sampled = torch.cat([
            F.grid_sample(part, grid[:, g], mode='bilinear', padding_mode='zeros',
                          align_corners=True)
            for g, part in enumerate(x.chunk(deform_groups, 1))], 1)
        if mask is not None:
            scale = mask.view(batch, deform_groups, kh * kw, out_h, out_w)[:, :, tap]
            sampled = sampled * scale.repeat_interleave(channels // deform_groups, 1)
        taps.append(sampled)
    columns = torch.stack(taps, 2).view(batch, groups, channels // groups, kh * kw, out_h, out_w)
    kernel = weight.view(groups, out_channels // groups, channels // groups, kh * kw)
    out = torch.einsum('bgckhw,gock->bgohw', columns, kernel).flatten(1, 2)
    return out if bias is None else out + bias[:, None, None]


GEOMETRIES = {'3x3, stride 1': dict(stride=1, padding=1, dilation=1, groups=1, deform_groups=1),
              'strided, dilated, grouped': dict(stride=2, padding=2, dilation=2, groups=2,
                                                deform_groups=2)}


def _conv_inputs(dtype: torch.dtype, geometry: dict, modulated: bool) -> list[torch.Tensor]:
    """Input, offsets (up to ~3 pixels, so that taps fall beyond the edges), mask, weight."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 9, 8, generator=gen)
    out_h, out_w = ((size + 2 * geometry['padding'] - 2 * geometry['dilation'] - 1)
                    // geometry['stride'] + 1 for size in (9, 8))
    taps = geometry['deform_groups'] * 9
    offset = 1.5 * torch.randn(2, 2 * taps, out_h, out_w, generator=gen)
    mask = torch.rand(2, taps, out_h, out_w, generator=gen)
    weight = torch.randn(6, 4 // geometry['groups'], 3, 3, generator=gen)
    inputs = [x, offset, mask, weight] if modulated else [x, offset, weight]
    return [t.to(dtype).requires_grad_() for t in inputs]


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('geometry', GEOMETRIES.values(), ids=GEOMETRIES.keys())
def test_deform_conv_equals_the_formula(dtype, geometry):
    args = tuple(geometry.values())
    assert_op_matches(
        lambda x, offset, weight: mmcv.ops.deform_conv2d(x, offset, weight, *args),
        lambda x, offset, weight: _deform_conv_reference(x, offset, None, weight, None,
                                                         **geometry),
        _conv_inputs(dtype, geometry, modulated=False), ['input', 'offset', 'weight'])


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('geometry', GEOMETRIES.values(), ids=GEOMETRIES.keys())
def test_modulated_deform_conv_equals_the_formula(dtype, geometry):
    bias = torch.randn(6, generator=torch.Generator().manual_seed(5)).to(dtype).requires_grad_()
    args = tuple(geometry.values())
    assert_op_matches(
        lambda x, offset, mask, weight, b: mmcv.ops.modulated_deform_conv2d(
            x, offset, mask, weight, b, *args),
        lambda x, offset, mask, weight, b: _deform_conv_reference(x, offset, mask, weight, b,
                                                                  **geometry),
        [*_conv_inputs(dtype, geometry, modulated=True), bias],
        ['input', 'offset', 'mask', 'weight', 'bias'])


@pytest.mark.parametrize('modulated', [False, True], ids=['DCNv1', 'DCNv2'])
def test_deform_conv_in_bfloat16_on_the_cpu_computes_in_float32(modulated):
    """torchvision's CPU kernels have no bfloat16: the values and gradients are float32's on
    the same (bfloat16) inputs, rounded to bfloat16."""
    geometry = GEOMETRIES['strided, dilated, grouped']
    args = tuple(geometry.values())
    results = {}
    for dtype in (torch.bfloat16, torch.float32):
        inputs = [t.detach().bfloat16().to(dtype).requires_grad_()
                  for t in _conv_inputs(torch.float32, geometry, modulated)]
        out = (mmcv.ops.modulated_deform_conv2d(*inputs, None, *args) if modulated
               else mmcv.ops.deform_conv2d(*inputs, *args))
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
        out.backward(grad.bfloat16().to(dtype))
        assert out.dtype == dtype
        results[dtype] = [out, *(t.grad for t in inputs)]
    for low, full in zip(results[torch.bfloat16], results[torch.float32]):
        assert torch.equal(low, full.bfloat16())


def test_deform_conv_backward_runs_torchvisions_backward_once(monkeypatch):
    """mmcv's DCNv1 backward makes two compiled calls (input and offset, then weight); the
    weight's gradient of the first is kept for the second."""
    calls = []
    backward = deform_conv._deform_conv2d_backward
    monkeypatch.setattr(deform_conv, '_deform_conv2d_backward',
                        lambda *args: calls.append(1) or backward(*args))
    geometry = GEOMETRIES['3x3, stride 1']
    x, offset, weight = _conv_inputs(torch.float64, geometry, modulated=False)
    out = mmcv.ops.deform_conv2d(x, offset, weight, *geometry.values())
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=out.dtype)
    out.backward(grad)
    assert len(calls) == 1 and not deform_conv._pending_weight_grad
    reference = _deform_conv_reference(x, offset, None, weight, None, **geometry)
    (by_weight,) = torch.autograd.grad(reference, [weight], grad)
    assert_matches('gradient by weight', weight.grad, by_weight, GRADIENT_RTOL)
    frozen_input = mmcv.ops.deform_conv2d(x.detach(), offset.detach(), weight,
                                          *geometry.values())
    weight.grad = None
    frozen_input.backward(grad)   # only the weight's gradient: computed alone
    assert len(calls) == 2
    assert_matches('gradient by weight alone', weight.grad, by_weight, GRADIENT_RTOL)


def test_modulated_deform_conv_pack_under_autocast():
    torch.manual_seed(0)
    conv = mmcv.ops.ModulatedDeformConv2dPack(4, 6, 3, padding=1)
    torch.nn.init.normal_(conv.conv_offset.weight, std=0.3)
    x = torch.randn(2, 4, 9, 8)
    with torch.autocast('cpu', dtype=torch.float16):
        out = conv(x)
        offset_and_mask = conv.conv_offset(x)
    assert out.dtype == torch.float16
    o1, o2, mask = offset_and_mask.float().chunk(3, 1)
    reference = _deform_conv_reference(x.half().float(), torch.cat([o1, o2], 1), mask.sigmoid(),
                                       conv.weight.half().float(), conv.bias.half().float(),
                                       1, 1, 1, 1, 1)
    assert relative_error(out.float(), reference) < 5e-3


# --- masked convolution ---------------------------------------------------------------------

@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('kernel', [1, 3, 5])
def test_masked_conv_equals_the_convolution_at_the_masked_positions(dtype, kernel):
    """Guided Anchoring's and SABL's 'same' convolutions (the mask is the input's size)."""
    gen = torch.Generator().manual_seed(0)
    conv = mmcv.ops.MaskedConv2d(4, 6, kernel, padding=kernel // 2).to(dtype)
    x = torch.randn(1, 4, 9, 8, generator=gen).to(dtype)
    mask = (torch.rand(1, 9, 8, generator=gen) > 0.6).to(dtype)
    reference = F.conv2d(x, conv.weight, conv.bias, padding=kernel // 2) * (mask[:, None] > 0)
    assert_matches('masked convolution', conv(x, mask), reference, FORWARD_RTOL)


# --- PSANet's attention masks ---------------------------------------------------------------

def _psamask_reference(mask: torch.Tensor, collect: bool, h_mask: int,
                       w_mask: int) -> torch.Tensor:
    """mmcv's kernel loop: the mask value of offset (i, j) at feature position (h, w) goes to
    row (h + i - h_mask // 2, w + j - w_mask // 2) of column (h, w) of the attention map
    (collect), or the transposed place (distribute), where that row is on the map."""
    batch, _, height, width = mask.shape
    out = mask.new_zeros(batch, height * width, height * width)
    for h in range(height):
        for w in range(width):
            for i in range(h_mask):
                for j in range(w_mask):
                    y, x = h + i - (h_mask - 1) // 2, w + j - (w_mask - 1) // 2
                    if 0 <= y < height and 0 <= x < width:
                        row, col = (y * width + x, h * width + w)
                        row, col = (row, col) if collect else (col, row)
                        out[:, row, col] = mask[:, i * w_mask + j, h, w]
    return out.view(batch, height * width, height, width)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('psa_type', ['collect', 'distribute'])
def test_psamask_equals_the_kernel_loop(dtype, psa_type):
    mask_size = (5, 3)
    mask = torch.randn(2, 15, 4, 6, generator=torch.Generator().manual_seed(0)).to(dtype)
    assert_op_matches(
        mmcv.ops.PSAMask(psa_type, mask_size),
        lambda m: _psamask_reference(m, psa_type == 'collect', *mask_size),
        [mask.requires_grad_()], ['mask'])
