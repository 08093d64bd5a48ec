"""The served deformable convolutions and multi-scale deformable attention at the edges of
their sampling, against references written from mmcv's CUDA kernels
(``deform_conv_cuda_kernel.cuh``, ``modulated_deform_conv_cuda_kernel.cuh``,
``ms_deform_attn_cuda_kernel.cuh``): sample points on integers, at exactly -1, just inside,
on the last row and column, at H and beyond, NaN and +-inf, forward and every gradient in
float64; offsets and masks read as the kernel reads them (DyHead's twice-the-output maps);
mmdet's DyHead neck and GLIP's DyConv.  Non-finite points (NaN, +-inf) are compared in a
child process, so that a crash fails their test, not the suite."""
from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import mmcv.ops
import pytest
import torch
from mmcv.ops.multi_scale_deform_attn import MultiScaleDeformableAttnFunction
from test_mmcv_ext_ops import FORWARD_RTOL, GRADIENT_RTOL, INJECTED_ERROR, assert_matches

# sample coordinates (pixels) the kernels treat specially: -1 and H (or W) are outside,
# (-1, 0) reads only the first row, [H - 1, H) only the last
EDGES = (-1.0, -0.75, 0.0, 1.0, 2.5, -1.5, 'last', 'last+0.5', 'size', 'size+0.5')
NON_FINITE = (math.nan, math.inf, -math.inf)   # outside as well (no comparison is true)


def _edge(code: float | str, size: int) -> float:
    """An entry of :data:`EDGES` on an axis of ``size`` pixels."""
    return {'last': size - 1.0, 'last+0.5': size - 0.5, 'size': float(size),
            'size+0.5': size + 0.5}.get(code, code)


def _edge_points(count: int, height: int, width: int,
                 non_finite: bool) -> list[tuple[float, float]]:
    """``count`` (y, x) sample points: each edge coordinate (and each non-finite one, if
    asked) on either axis with the other at an ordinary interior place, then pairs of edges."""
    edges = EDGES + NON_FINITE if non_finite else EDGES
    inner = [(1.25, 2.5), (0.5, 1.75), (2.0, 0.25)]
    points = []
    for k, code in enumerate(edges):
        y, x = inner[k % len(inner)]
        points += [(_edge(code, height), x), (y, _edge(code, width))]
    for k, code in enumerate(edges):
        points.append((_edge(code, height), _edge(edges[(k + 3) % len(edges)], width)))
    return [points[k % len(points)] for k in range(count)]


def _inside(y: float, x: float, height: int, width: int) -> bool:
    """The kernels' test of a sample point (false for NaN)."""
    return y > -1 and x > -1 and y < height and x < width


def _corners(y: float, x: float, height: int, width: int) -> list[tuple[int, int, float, float,
                                                                      float]]:
    """The kernels' bilinear corners on the map: (row, column, weight, d weight / dy,
    d weight / dx) for each corner of an inside point that lies on the map."""
    y_low, x_low = math.floor(y), math.floor(x)
    ly, lx = y - y_low, x - x_low
    corners = [(y_low, x_low, (1 - ly) * (1 - lx), -(1 - lx), -(1 - ly)),
               (y_low, x_low + 1, (1 - ly) * lx, -lx, 1 - ly),
               (y_low + 1, x_low, ly * (1 - lx), 1 - lx, -ly),
               (y_low + 1, x_low + 1, ly * lx, lx, ly)]
    return [c for c in corners if 0 <= c[0] <= height - 1 and 0 <= c[1] <= width - 1]


# --- deformable convolution -----------------------------------------------------------------

def _deform_conv_kernel(x: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor | None,
                        weight: torch.Tensor, bias: torch.Tensor | None, grad_out: torch.Tensor,
                        stride: int, padding: int, dilation: int, groups: int,
                        deform_groups: int) -> dict[str, torch.Tensor]:
    """mmcv's (modulated) deformable convolution kernels, one sample point at a time: the
    output and the gradients for ``grad_out``.  im2col reads a point only when
    ``-1 < y < H and -1 < x < W`` (``deformable_im2col_gpu_kernel``); col2im adds to the
    corners of such points (``get_gradient_weight``); col2im_coord moves any other point to
    (-2, -2), where ``get_coordinate_weight`` and the mask's bilinear read give 0.  A NaN
    point fails col2im_coord's comparisons too, so the compiled kernel leaves it where it is
    and gives it NaN gradients: here (as in the served op, a documented difference) it passes
    0.  The offsets and mask are each sample's first values in the output's layout."""
    batch, channels, height, width = x.shape
    out_channels, _, kh, kw = weight.shape
    out_h, out_w = grad_out.shape[-2:]
    taps, per_group = kh * kw, channels // deform_groups
    read_offset = offset.reshape(batch, -1)[:, :deform_groups * taps * 2 * out_h * out_w]
    read_offset = read_offset.reshape(batch, deform_groups, taps, 2, out_h, out_w)
    read_mask = (torch.ones(batch, deform_groups, taps, out_h, out_w, dtype=x.dtype)
                 if mask is None else
                 mask.reshape(batch, -1)[:, :deform_groups * taps * out_h * out_w]
                 .reshape(batch, deform_groups, taps, out_h, out_w))
    kernel = weight.view(groups, out_channels // groups, channels // groups, taps)
    grad_by_group = grad_out.view(batch, groups, out_channels // groups, out_h, out_w)
    grad_columns = torch.einsum('gock,bgohw->bgckhw', kernel, grad_by_group).reshape(
        batch, channels, taps, out_h, out_w)
    columns = torch.zeros(batch, channels, taps, out_h, out_w, dtype=x.dtype)
    grad_x, grad_offset = torch.zeros_like(x), torch.zeros_like(read_offset)
    grad_mask = torch.zeros_like(read_mask)
    for b in range(batch):
        for g in range(deform_groups):
            chans = slice(g * per_group, (g + 1) * per_group)
            image = x[b, chans]
            for tap in range(taps):
                i, j = divmod(tap, kw)
                for r in range(out_h):
                    for c in range(out_w):
                        dy, dx = read_offset[b, g, tap, :, r, c].tolist()
                        y = r * stride - padding + i * dilation + dy
                        x_ = c * stride - padding + j * dilation + dx
                        if not _inside(y, x_, height, width):
                            continue   # reads 0, passes nothing
                        m = read_mask[b, g, tap, r, c]
                        top = grad_columns[b, chans, tap, r, c]
                        value = torch.zeros(per_group, dtype=x.dtype)
                        by_y, by_x = torch.zeros_like(value), torch.zeros_like(value)
                        for row, col, w, dw_dy, dw_dx in _corners(y, x_, height, width):
                            pixel = image[:, row, col]
                            value += w * pixel
                            by_y += dw_dy * pixel
                            by_x += dw_dx * pixel
                            grad_x[b, chans, row, col] += w * top * m
                        columns[b, chans, tap, r, c] = value * m
                        grad_offset[b, g, tap, 0, r, c] = (by_y * top).sum() * m
                        grad_offset[b, g, tap, 1, r, c] = (by_x * top).sum() * m
                        grad_mask[b, g, tap, r, c] = (value * top).sum()
    by_group = columns.view(batch, groups, channels // groups, taps, out_h, out_w)
    out = torch.einsum('gock,bgckhw->bgohw', kernel, by_group).reshape(grad_out.shape)
    grad_weight = torch.einsum('bgohw,bgckhw->gock', grad_by_group, by_group)
    result = {'output': out if bias is None else out + bias[:, None, None],
              'input': grad_x, 'weight': grad_weight.reshape(weight.shape),
              'offset': _into_buffer(offset, grad_offset)}
    if mask is not None:
        result['mask'] = _into_buffer(mask, grad_mask)
    if bias is not None:
        result['bias'] = grad_out.sum((0, 2, 3))
    return result


def _into_buffer(buffer: torch.Tensor, read_grad: torch.Tensor) -> torch.Tensor:
    """The gradient by ``buffer``: the kernel's gradient of the values it read, in each
    sample's first values; zero in the rest."""
    grad = torch.zeros(len(buffer), buffer[0].numel(), dtype=buffer.dtype)
    grad[:, :read_grad[0].numel()] = read_grad.reshape(len(buffer), -1)
    return grad.view(buffer.shape)


def _edge_offsets(batch: int, deform_groups: int, kh: int, kw: int, out_hw: tuple[int, int],
                  map_hw: tuple[int, int], stride: int, padding: int, dilation: int,
                  buffer_hw: tuple[int, int], non_finite: bool) -> torch.Tensor:
    """Offsets that put the taps on the edge points of a ``map_hw`` input, in a buffer of
    ``buffer_hw`` (the output's size by default) of which the kernel reads the first values."""
    out_h, out_w = out_hw
    points = iter(_edge_points(batch * deform_groups * kh * kw * out_h * out_w, *map_hw,
                               non_finite))
    read = torch.zeros(batch, deform_groups, kh * kw, 2, out_h, out_w, dtype=torch.float64)
    for b, g, tap, r, c in torch.cartesian_prod(*(torch.arange(n) for n in read.shape[:3]),
                                                torch.arange(out_h), torch.arange(out_w)).tolist():
        i, j = divmod(tap, kw)
        y, x = next(points)
        read[b, g, tap, 0, r, c] = y - (r * stride - padding + i * dilation)
        read[b, g, tap, 1, r, c] = x - (c * stride - padding + j * dilation)
    buffer_h, buffer_w = buffer_hw
    noise = torch.randn(batch, deform_groups * kh * kw * 2 * buffer_h * buffer_w,
                        generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    noise[:, :read[0].numel()] = read.reshape(batch, -1)
    return noise.view(batch, -1, buffer_h, buffer_w)


GEOMETRIES = {'3x3 padding 1': dict(stride=1, padding=1, dilation=1, groups=1, deform_groups=1),
              'strided, dilated, grouped': dict(stride=2, padding=2, dilation=2, groups=2,
                                                deform_groups=2)}


def _served_deform_conv(inputs: dict[str, torch.Tensor], geometry: dict,
                        grad_out: torch.Tensor) -> dict[str, torch.Tensor]:
    """The served op through mmcv's entry point: the output and every gradient."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inputs.items()}
    args = tuple(geometry.values())
    if 'mask' in leaves:
        out = mmcv.ops.modulated_deform_conv2d(leaves['input'], leaves['offset'],
                                               leaves['mask'], leaves['weight'],
                                               leaves['bias'], *args)
    else:
        out = mmcv.ops.deform_conv2d(leaves['input'], leaves['offset'], leaves['weight'],
                                     *args)
    out.backward(grad_out)
    return {'output': out.detach(), **{k: v.grad for k, v in leaves.items()}}


def _conv_case(geometry: dict, modulated: bool, buffer_scale: int = 1, non_finite: bool = False
               ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Inputs whose taps fall on the edge points, and an output gradient; the offset and
    mask buffers ``buffer_scale`` times the output's size on each axis."""
    gen = torch.Generator().manual_seed(0)
    height, width, channels = 5, 6, 4
    s, p, d = geometry['stride'], geometry['padding'], geometry['dilation']
    out_hw = tuple((n + 2 * p - 2 * d - 1) // s + 1 for n in (height, width))
    buffer_hw = tuple(n * buffer_scale for n in out_hw)
    dg = geometry['deform_groups']
    inputs = {'input': torch.randn(2, channels, height, width, generator=gen,
                                   dtype=torch.float64),
              'offset': _edge_offsets(2, dg, 3, 3, out_hw, (height, width), s, p, d, buffer_hw,
                                      non_finite),
              'weight': torch.randn(6, channels // geometry['groups'], 3, 3, generator=gen,
                                    dtype=torch.float64)}
    if modulated:
        inputs['mask'] = torch.rand(2, dg * 9, *buffer_hw, generator=gen, dtype=torch.float64)
        inputs['bias'] = torch.randn(6, generator=gen, dtype=torch.float64)
    return inputs, torch.randn(2, 6, *out_hw, generator=gen, dtype=torch.float64)


def _reference_deform_conv(inputs: dict[str, torch.Tensor], geometry: dict,
                           grad_out: torch.Tensor) -> dict[str, torch.Tensor]:
    return _deform_conv_kernel(inputs['input'], inputs['offset'], inputs.get('mask'),
                               inputs['weight'], inputs.get('bias'), grad_out, **geometry)


def _assert_all_match(served: dict[str, torch.Tensor],
                      reference: dict[str, torch.Tensor]) -> None:
    assert served.keys() == reference.keys()
    for name in served:
        assert_matches(name if name == 'output' else f'gradient by {name}', served[name],
                       reference[name], FORWARD_RTOL if name == 'output' else GRADIENT_RTOL)


def check_deform_conv_edges(modulated: bool, geometry: dict, non_finite: bool) -> None:
    """The served (modulated) deformable convolution at the edge points equals the kernels."""
    inputs, grad_out = _conv_case(geometry, modulated, non_finite=non_finite)
    _assert_all_match(_served_deform_conv(inputs, geometry, grad_out),
                      _reference_deform_conv(inputs, geometry, grad_out))


@pytest.mark.parametrize('modulated', [False, True], ids=['DCNv1', 'DCNv2'])
@pytest.mark.parametrize('geometry', GEOMETRIES.values(), ids=GEOMETRIES.keys())
def test_deform_conv_at_the_edge_points_equals_the_kernels(modulated, geometry):
    check_deform_conv_edges(modulated, geometry, non_finite=False)


@pytest.mark.parametrize('gradient', ['output', 'input', 'offset', 'mask', 'weight', 'bias'])
def test_the_edge_comparison_fails_on_a_0_1_percent_error(gradient):
    """Each output and gradient of the edge case, 0.1 % off at its largest element, fails."""
    geometry = GEOMETRIES['3x3 padding 1']
    inputs, grad_out = _conv_case(geometry, modulated=True)
    served = _served_deform_conv(inputs, geometry, grad_out)
    flat = served[gradient].view(-1)
    largest = flat.abs().argmax()
    flat[largest] += INJECTED_ERROR * flat[largest].abs()
    with pytest.raises(AssertionError, match='relative error'):
        _assert_all_match(served, _reference_deform_conv(inputs, geometry, grad_out))


def test_zero_offsets_at_initialisation_pass_no_offset_gradient_at_minus_one():
    """mmcv's zero-initialised ``conv_offset``: a 3x3, padding-1 DCN samples its top and left
    taps of the first row and column at exactly -1, where the kernels' offset gradient is 0
    (torchvision's is a one-sided difference)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 3, 4, 5, generator=gen, dtype=torch.float64)
    weight = torch.randn(2, 3, 3, 3, generator=gen, dtype=torch.float64)
    offset = torch.zeros(1, 18, 4, 5, dtype=torch.float64, requires_grad=True)
    mmcv.ops.deform_conv2d(x, offset, weight, 1, 1).sum().backward()
    by_tap = offset.grad.view(3, 3, 2, 4, 5)
    assert (by_tap[0, :, 0, 0] == 0).all() and (by_tap[:, 0, 1, :, 0] == 0).all()
    assert (by_tap[1, 1] != 0).any()   # the centre tap does get a gradient


@pytest.mark.parametrize('scale', [2, 1])
def test_dcnv2_reads_each_samples_first_values_of_a_larger_buffer(scale):
    """DyHead computes the offsets and mask on a map twice the output's size; the kernel reads
    each sample's first C x H_out x W_out values, and so does the served op."""
    geometry = GEOMETRIES['3x3 padding 1']
    inputs, grad_out = _conv_case(geometry, modulated=True, buffer_scale=scale)
    served = _served_deform_conv(inputs, geometry, grad_out)
    _assert_all_match(served, _reference_deform_conv(inputs, geometry, grad_out))


def test_offset_buffers_the_kernels_cannot_read_raise():
    geometry = GEOMETRIES['3x3 padding 1']
    inputs, _ = _conv_case(geometry, modulated=True)
    small = inputs['offset'][:, :, :2]
    with pytest.raises(ValueError, match=r'offset is \(2, 18, 2, 6\), but the kernel reads '
                                         r'18 x 5 x 6 values of each sample'):
        mmcv.ops.modulated_deform_conv2d(inputs['input'], small, inputs['mask'],
                                         inputs['weight'], inputs['bias'], 1, 1)
    large, _ = _conv_case(geometry, modulated=False, buffer_scale=2)
    with pytest.raises(ValueError, match=r'deform_conv: the offset is \(2, 18, 10, 12\)'):
        mmcv.ops.deform_conv2d(large['input'], large['offset'], large['weight'], 1, 1)


def test_mmdet_dyhead_and_glip_dyconv_run_and_train():
    """mmdet's DyHead neck and GLIP's DyConv (with DCN) on a three-level pyramid: both apply
    a DCN to the next level with offsets computed on this one (twice the output's size)."""
    from mmdet.models.dense_heads.atss_vlfusion_head import Conv3x3Norm, DyConv
    from mmdet.models.necks import DyHead
    torch.manual_seed(0)
    levels = [torch.randn(2, 16, 16 // 2 ** k, 12 // 2 ** k) for k in range(3)]
    neck = DyHead(16, 16, num_blocks=2)
    outs = neck(levels)
    sum(o.square().mean() for o in outs).backward()
    offset_conv = neck.dyhead_blocks[0].spatial_conv_offset
    assert [o.shape for o in outs] == [t.shape for t in levels]
    assert all(torch.isfinite(o).all() for o in outs)
    assert offset_conv.weight.grad.abs().sum() > 0
    assert torch.isfinite(offset_conv.weight.grad).all()

    dyconv = DyConv(lambda i, o, s: Conv3x3Norm(i, o, s, use_dcn=True), 16, 16,
                    use_dcn=True)
    torch.nn.init.normal_(dyconv.offset.weight, std=0.1)
    outs = dyconv({'visual': levels, 'lang': None})['visual']
    sum(o.square().mean() for o in outs).backward()
    assert [o.shape for o in outs] == [t.shape for t in levels]
    offset_grad = dyconv.offset.weight.grad
    assert torch.isfinite(offset_grad).all() and offset_grad.abs().sum() > 0


# --- multi-scale deformable attention -------------------------------------------------------

ATTENTION_SHAPES = torch.tensor([[4, 8], [2, 4]])   # powers of two: edge pixels exact
ATTENTION_STARTS = torch.tensor([0, 32])


def _ms_deform_attn_kernel(value: torch.Tensor, locations: torch.Tensor, weights: torch.Tensor,
                           grad_out: torch.Tensor) -> dict[str, torch.Tensor]:
    """mmcv's ``ms_deformable_im2col_gpu_kernel`` and ``ms_deformable_col2im_bilinear``, one
    sampling point at a time: pixel ``(loc_y * H - 0.5, loc_x * W - 0.5)``, read and
    differentiated only when ``-1 < y < H and -1 < x < W``."""
    batch, _, heads, dims = value.shape
    queries, levels, points = locations.shape[1], locations.shape[3], locations.shape[4]
    out = torch.zeros(batch, queries, heads, dims, dtype=value.dtype)
    grad_value, grad_locations = torch.zeros_like(value), torch.zeros_like(locations)
    grad_weights = torch.zeros_like(weights)
    top = grad_out.view(batch, queries, heads, dims)
    for b, q, h, lvl, p in torch.cartesian_prod(
            *(torch.arange(n) for n in (batch, queries, heads, levels, points))).tolist():
        height, width = ATTENTION_SHAPES[lvl].tolist()
        start = int(ATTENTION_STARTS[lvl])
        loc_x, loc_y = locations[b, q, h, lvl, p].tolist()
        y, x = loc_y * height - 0.5, loc_x * width - 0.5
        if not _inside(y, x, height, width):
            continue
        attention = weights[b, q, h, lvl, p]
        sample = torch.zeros(dims, dtype=value.dtype)
        by_y, by_x = torch.zeros_like(sample), torch.zeros_like(sample)
        for row, col, w, dw_dy, dw_dx in _corners(y, x, height, width):
            pixel = value[b, start + row * width + col, h]
            sample += w * pixel
            by_y += dw_dy * pixel
            by_x += dw_dx * pixel
            grad_value[b, start + row * width + col, h] += w * attention * top[b, q, h]
        out[b, q, h] += attention * sample
        grad_weights[b, q, h, lvl, p] = (top[b, q, h] * sample).sum()
        grad_locations[b, q, h, lvl, p, 0] = width * (by_x * top[b, q, h]).sum() * attention
        grad_locations[b, q, h, lvl, p, 1] = height * (by_y * top[b, q, h]).sum() * attention
    return {'output': out.view(batch, queries, heads * dims), 'value': grad_value,
            'sampling locations': grad_locations, 'attention weights': grad_weights}


def _attention_case(non_finite: bool = False) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Value, sampling locations on the edge pixels of each level, weights, output gradient."""
    gen = torch.Generator().manual_seed(0)
    batch, queries, heads, dims, points = 2, 5, 2, 3, 4
    levels = len(ATTENTION_SHAPES)
    locations = torch.zeros(batch, queries, heads, levels, points, 2, dtype=torch.float64)
    for lvl, (height, width) in enumerate(ATTENTION_SHAPES.tolist()):
        pixels = torch.tensor(_edge_points(batch * queries * heads * points, height, width,
                                           non_finite), dtype=torch.float64)
        pixels = pixels.view(batch, queries, heads, points, 2)
        locations[:, :, :, lvl, :, 0] = (pixels[..., 1] + 0.5) / width
        locations[:, :, :, lvl, :, 1] = (pixels[..., 0] + 0.5) / height
    keys = int(ATTENTION_SHAPES.prod(1).sum())
    inputs = {'value': torch.randn(batch, keys, heads, dims, generator=gen, dtype=torch.float64),
              'sampling locations': locations,
              'attention weights': torch.rand(batch, queries, heads, levels, points,
                                              generator=gen, dtype=torch.float64)}
    return inputs, torch.randn(batch, queries, heads * dims, generator=gen, dtype=torch.float64)


def check_ms_deform_attn_edges(non_finite: bool) -> None:
    """The served deformable attention at the edge points equals the kernel; at exactly -1
    the gradient by the location is 0."""
    inputs, grad_out = _attention_case(non_finite)
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items()}
    out = MultiScaleDeformableAttnFunction.apply(
        leaves['value'], ATTENTION_SHAPES, ATTENTION_STARTS, leaves['sampling locations'],
        leaves['attention weights'], 64)
    out.backward(grad_out)
    served = {'output': out.detach(), **{k: v.grad for k, v in leaves.items()}}
    reference = _ms_deform_attn_kernel(inputs['value'], inputs['sampling locations'],
                                       inputs['attention weights'], grad_out)
    _assert_all_match(served, reference)
    level_0_y = inputs['sampling locations'][:, :, :, 0, :, 1] * 4 - 0.5   # 4 rows
    at_minus_one = level_0_y == -1
    assert at_minus_one.any()
    assert (served['sampling locations'][:, :, :, 0, :][at_minus_one] == 0).all()


def test_ms_deform_attn_at_the_edge_points_equals_the_kernel():
    check_ms_deform_attn_edges(non_finite=False)


# --- NaN and infinite offsets: a child process, so that a crash fails the test, not the suite

CHILD_SCRIPT = textwrap.dedent('''
    import itertools, torch, mmcv.ops
    import test_mmcv_ext_edges as edges
    for modulated, geometry in itertools.product([False, True], edges.GEOMETRIES.values()):
        edges.check_deform_conv_edges(modulated, geometry, non_finite=True)
    edges.check_ms_deform_attn_edges(non_finite=True)
    x = torch.randn(2, 4, 9, 8, requires_grad=True)
    weight = torch.randn(6, 4, 3, 3, requires_grad=True)
    offset = torch.full((2, 18, 9, 8), float('nan'), requires_grad=True)
    mask = torch.rand(2, 9, 9, 8, requires_grad=True)
    outs = [mmcv.ops.deform_conv2d(x, offset, weight, 1, 1),
            mmcv.ops.modulated_deform_conv2d(x, offset, mask, weight, None, 1, 1)]
    sum(o.sum() for o in outs).backward()
    print(all(bool(t.isfinite().all()) for t in outs + [x.grad, offset.grad, mask.grad]))
''')


def test_nan_and_infinite_points_read_as_outside_in_a_child_process():
    """Sample points at NaN and +-inf among the edge points (DCNv1, DCNv2 and deformable
    attention) equal the kernels' reading of them as outside, and all-NaN offsets give finite
    outputs and gradients (the compiled DCN backward gives NaN ones: a documented
    difference): in a process of its own, which must survive."""
    run = subprocess.run([sys.executable, '-c', CHILD_SCRIPT], capture_output=True, text=True,
                         timeout=300, cwd=Path(__file__).parent)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ['True']
