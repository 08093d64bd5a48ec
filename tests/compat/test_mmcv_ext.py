"""The torch-native ``mmcv._ext``: nms and RoIAlign (average and max pooling) equal hand
computations and independent references through mmcv's own Python wrappers; every op it does
not serve raises an error naming it; the table of op kinds serving it.  The other served
ops: ``test_mmcv_ext_ops.py``."""
from __future__ import annotations

import sys

import math

import mmcv.ops
import pytest
import torch

from vitdense.compat.mmcv_ext import MissingCompiledOpError

mmcv_ext = sys.modules['mmcv._ext']


def test_mmcv_ops_run_on_the_torch_native_backend():
    assert mmcv_ext.__file__.endswith('vitdense/compat/mmcv_ext.py'), \
        'tools/install.sh installs mmcv-lite, served by vitdense/compat/mmcv_ext.py'
    assert mmcv.ops.get_compiler_version().startswith('none (vitdense torch-native')


def test_each_served_function_comes_from_one_op_kind_module():
    """``mmcv._ext`` serves what ``vitdense/compat/ops/<kind>.py`` name, no name twice (one
    kind's function would hide another's), each the module's own function; its deformable
    attention samples with the layer's sampler, one module however each was loaded."""
    kinds = [sys.modules[f'vitdense.compat.ops.{kind}'] for kind in mmcv_ext.KINDS]
    names = [name for module in kinds for name in module.__all__]
    assert len(names) == len(set(names))
    assert mmcv_ext.IMPLEMENTED == {*names, 'get_compiler_version', 'get_compiling_cuda_version'}
    assert all(getattr(mmcv_ext, name) is getattr(module, name)
               for module in kinds for name in module.__all__)
    from vitdense.models.layers import deformable_sampling
    served_sampler = sys.modules['vitdense.compat.ops.ms_deform_attn'].deformable_sampling
    assert served_sampler is deformable_sampling.deformable_sampling


def _random_boxes(n: int, seed: int, size: float = 100.0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=gen) * size
    wh = torch.rand(n, 2, generator=gen) * size / 3
    return torch.cat([xy, xy + wh], 1), torch.rand(n, generator=gen)


def _greedy_nms(boxes: torch.Tensor, scores: torch.Tensor, iou: float,
                offset: int = 0) -> list[int]:
    """Textbook greedy NMS, one pair at a time, visiting boxes by descending score and ties
    by ascending index (python's ``sorted`` is stable; torch's sort is not used here)."""
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))
    b = boxes.tolist()
    area = [(x2 - x1 + offset) * (y2 - y1 + offset) for x1, y1, x2, y2 in b]
    kept: list[int] = []
    for i in order:
        suppressed = False
        for j in kept:
            w = max(0.0, min(b[i][2], b[j][2]) - max(b[i][0], b[j][0]) + offset)
            h = max(0.0, min(b[i][3], b[j][3]) - max(b[i][1], b[j][1]) + offset)
            inter = w * h
            if inter / (area[i] + area[j] - inter) > iou:
                suppressed = True
                break
        if not suppressed:
            kept.append(i)
    return kept


@pytest.mark.parametrize('offset', [0, 1])
def test_nms_keeps_what_greedy_nms_keeps(offset):
    boxes, scores = _random_boxes(300, seed=offset)
    dets, kept = mmcv.ops.nms(boxes, scores, 0.5, offset=offset)
    assert kept.tolist() == _greedy_nms(boxes, scores, 0.5, offset)
    assert torch.equal(dets, torch.cat([boxes[kept], scores[kept, None]], 1))


def test_nms_of_float16_boxes_visits_them_in_score_order_past_2048():
    """float16 holds distinct integers only up to 2,048: the ranks that fix torchvision's
    visiting order are not made in the boxes' dtype."""
    boxes, scores = _random_boxes(3000, seed=7, size=200.0)
    boxes[:, 2:] += 1   # no box empty in float16
    _, kept = mmcv.ops.nms(boxes.half(), scores.half(), 0.3)
    assert kept.tolist() == _greedy_nms(boxes.half().float(), scores.half(), 0.3)


def test_nms_ties_overlap_and_empty_input():
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60], [0, 0, 10, 10.]])
    scores = torch.tensor([0.9, 0.9, 0.9, 0.9])
    assert mmcv_ext.nms(boxes, scores, 0.5, 0).tolist() == _greedy_nms(boxes, scores, 0.5)
    # IoU exactly 0.5 is not above the threshold: both kept
    halves = torch.tensor([[0, 0, 2, 1], [0, 0, 1, 1.]])
    assert mmcv_ext.nms(halves, torch.tensor([0.9, 0.8]), 0.5, 0).tolist() == [0, 1]
    empty = mmcv_ext.nms(torch.zeros(0, 4), torch.zeros(0), 0.5, 0)
    assert empty.dtype == torch.long and empty.shape == (0,)


def test_nms_visits_equal_scores_by_index():
    # Many boxes sharing a few scores: which of two overlapping equal-score boxes survives
    # depends on the visiting order of ties (an unstable sort reorders them past ~100).
    boxes, _ = _random_boxes(400, seed=4)
    scores = torch.randint(0, 4, (400,), generator=torch.Generator().manual_seed(4)) / 4
    assert mmcv_ext.nms(boxes, scores, 0.3, 0).tolist() == _greedy_nms(boxes, scores, 0.3)


def test_nms_score_threshold_and_max_num():
    boxes, scores = _random_boxes(200, seed=2)
    _, kept = mmcv.ops.nms(boxes, scores, 0.3, score_threshold=0.5, max_num=7)
    above = torch.nonzero(scores > 0.5).squeeze(1)
    expected = above[_greedy_nms(boxes[above], scores[above], 0.3)][:7]
    assert kept.tolist() == expected.tolist()


def test_batched_nms_offsets_classes_and_splits_large_inputs():
    boxes, scores = _random_boxes(600, seed=3)
    labels = torch.arange(600) % 3
    cfg = dict(iou_threshold=0.4)
    _, kept = mmcv.ops.batched_nms(boxes, scores, labels, cfg)
    expected = []
    for label in range(3):
        idx = torch.nonzero(labels == label).squeeze(1)
        expected += idx[_greedy_nms(boxes[idx], scores[idx], 0.4)].tolist()
    assert sorted(kept.tolist()) == sorted(expected)
    assert torch.equal(scores[kept], scores[kept].sort(descending=True)[0])
    # above split_thr boxes (10,000 by default), mmcv runs one nms per class
    _, split = mmcv.ops.batched_nms(boxes, scores, labels, dict(cfg, split_thr=100))
    assert split.tolist() == kept.tolist()


def _sequential_soft_nms(boxes: torch.Tensor, scores: torch.Tensor, iou: float, sigma: float,
                         min_score: float, method: int, offset: int) -> tuple[list, list]:
    """mmcv's soft-NMS kernel one box at a time: pick the first highest score left, swap it
    forward, decay the boxes after it, drop (swapping in the last box) those below
    ``min_score``.  Returns the kept indices and the rows of ``dets``."""
    b, sc, ind = boxes.tolist(), scores.tolist(), list(range(len(scores)))
    area = [(x2 - x1 + offset) * (y2 - y1 + offset) for x1, y1, x2, y2 in b]
    dets, n, i = [], len(sc), 0
    while i < n:
        m = max(range(i, n), key=lambda k: (sc[k], -k))
        for arr in (b, sc, ind, area):
            arr[i], arr[m] = arr[m], arr[i]
        dets.append(b[i] + [sc[i]])
        pos = i + 1
        while pos < n:
            w = max(0.0, min(b[i][2], b[pos][2]) - max(b[i][0], b[pos][0]) + offset)
            h = max(0.0, min(b[i][3], b[pos][3]) - max(b[i][1], b[pos][1]) + offset)
            ovr = w * h / (area[i] + area[pos] - w * h)
            if method == 2:
                sc[pos] *= math.exp(-ovr * ovr / sigma)
            elif ovr >= iou:
                sc[pos] *= 0.0 if method == 0 else 1 - ovr
            if sc[pos] < min_score:
                for arr in (b, sc, ind, area):
                    arr[pos] = arr[n - 1]
                n -= 1
                pos -= 1
            pos += 1
        i += 1
    return ind[:n], dets


@pytest.mark.parametrize('method, offset', [('naive', 0), ('linear', 0), ('gaussian', 0),
                                            ('linear', 1)])
def test_soft_nms_equals_the_kernels_sequential_loop(method, offset):
    boxes, _ = _random_boxes(120, seed=5, size=60.0)
    scores = torch.randint(1, 8, (120,), generator=torch.Generator().manual_seed(5)) / 8
    scores = scores.double()   # tied scores: the first of equals is kept first
    boxes = boxes.double()
    dets, kept = mmcv.ops.soft_nms(boxes, scores, 0.3, sigma=0.5, min_score=0.05,
                                   method=method, offset=offset)
    code = {'naive': 0, 'linear': 1, 'gaussian': 2}[method]
    expected, expected_dets = _sequential_soft_nms(boxes, scores, 0.3, 0.5, 0.05, code, offset)
    assert kept.tolist() == expected
    torch.testing.assert_close(dets, torch.tensor(expected_dets, dtype=torch.float64),
                               rtol=1e-12, atol=0)
    assert len(expected) < 120   # boxes were dropped, so the swapping order was exercised
    empty = mmcv_ext.softnms(torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, 5), 0.3, 0.5,
                             0.05, 2, 0)
    assert empty.dtype == torch.long and empty.shape == (0,)


def _sequential_nms_match(dets: torch.Tensor, iou: float) -> list[list[int]]:
    """mmcv's nms_match kernel one pair at a time, visiting boxes by descending score and ties
    by index."""
    b = dets[:, :4].tolist()
    area = [(x2 - x1) * (y2 - y1) for x1, y1, x2, y2 in b]
    order = sorted(range(len(b)), key=lambda k: -float(dets[k, 4]))
    suppressed, groups = set(), []
    for pos, i in enumerate(order):
        if i in suppressed:
            continue
        group = [i]
        for j in order[pos + 1:]:
            if j in suppressed:
                continue
            w = max(0.0, min(b[i][2], b[j][2]) - max(b[i][0], b[j][0]))
            h = max(0.0, min(b[i][3], b[j][3]) - max(b[i][1], b[j][1]))
            if w * h / (area[i] + area[j] - w * h) >= iou:
                suppressed.add(j)
                group.append(j)
        groups.append(group)
    return groups


def test_nms_match_groups_what_each_kept_box_suppresses():
    boxes, _ = _random_boxes(150, seed=6, size=50.0)
    scores = torch.randint(0, 6, (150,), generator=torch.Generator().manual_seed(6)) / 6
    dets = torch.cat([boxes, scores[:, None]], 1).double()
    groups = mmcv.ops.nms_match(dets, 0.4)
    assert [g.tolist() for g in groups] == _sequential_nms_match(dets, 0.4)
    assert sorted(sum((g.tolist() for g in groups), [])) == list(range(150))
    assert any(len(g) > 1 for g in groups) and mmcv.ops.nms_match(dets[:0], 0.4) == []


def _linear_map(h: int = 6, w: int = 7, batch: int = 2) -> torch.Tensor:
    """Feature maps whose value at (y, x) is x + 10 y (+ 100 per image): bilinear sampling of
    a linear function is exact, so every average equals the value at the samples' mean."""
    y, x = torch.meshgrid(torch.arange(h, dtype=torch.float32),
                          torch.arange(w, dtype=torch.float32), indexing='ij')
    return torch.stack([x + 10 * y + 100 * b for b in range(batch)])[:, None]


@pytest.mark.parametrize('aligned, roi', [(True, [1, 1.5, 0.5, 3.5, 2.5]),
                                          (False, [1, 1.0, 0.0, 3.0, 2.0])])
def test_roi_align_equals_hand_computed_bin_centres(aligned, roi):
    # aligned=True shifts the box by half a pixel: both cases cover x in [1, 3], y in [0, 2]
    out = mmcv.ops.roi_align(_linear_map(), torch.tensor([roi]), (2, 2), 1.0, 2, 'avg', aligned)
    centres = torch.tensor([[1.5 + 10 * 0.5, 2.5 + 10 * 0.5], [1.5 + 10 * 1.5, 2.5 + 10 * 1.5]])
    torch.testing.assert_close(out[0, 0], centres + 100, rtol=0, atol=1e-5)


def _roi_cases() -> torch.Tensor:
    """Inside, across the border, outside, degenerate (zero and negative size), batch 1.

    No sample point lies at y = -1 exactly: the kernels give a maximum there no gradient
    (mmcv's max-mode backward reads y = -1 as an empty bin)."""
    return torch.tensor([
        [0, 2.0, 3.0, 20.0, 14.0], [1, 5.3, 1.7, 9.9, 30.2], [0, -6.0, -4.2, 5.0, 6.0],
        [1, 28.0, 20.0, 40.0, 30.0], [0, 50.0, 50.0, 60.0, 70.0], [1, 7.0, 7.0, 7.0, 7.0],
        [0, 9.0, 9.0, 4.0, 3.0], [1, 0.0, 0.0, 31.0, 23.0]])


def _bilinear(feat: torch.Tensor, y: float, x: float) -> torch.Tensor:
    """mmcv's ``bilinear_interpolate``: zero beyond one pixel outside, clamped at the edges."""
    height, width = feat.shape[-2:]
    if y < -1.0 or y > height or x < -1.0 or x > width:
        return feat.new_zeros(feat.shape[0])
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(y), int(x)
    y1, x1 = (y0 + 1, x0 + 1)
    if y0 >= height - 1:
        y0 = y1 = height - 1
        y = float(y0)
    if x0 >= width - 1:
        x0 = x1 = width - 1
        x = float(x0)
    ly, lx = y - y0, x - x0
    return ((1 - ly) * (1 - lx) * feat[:, y0, x0] + (1 - ly) * lx * feat[:, y0, x1]
            + ly * (1 - lx) * feat[:, y1, x0] + ly * lx * feat[:, y1, x1])


_FLT_MAX = torch.finfo(torch.float32).max


def _pool(samples: list[torch.Tensor], mode: str, channels: torch.Tensor) -> torch.Tensor:
    """mmcv's pooling of one bin's samples: their mean (0 for none) or their maximum
    (-FLT_MAX for none)."""
    if mode == 'avg':
        return sum(samples, channels.new_zeros(channels.shape)) / max(len(samples), 1)
    if not samples:
        return channels.new_full(channels.shape, -_FLT_MAX)
    return torch.stack(samples).amax(0)


def _reference_roi_align(feats: torch.Tensor, rois: torch.Tensor, size: int, scale: float,
                         sampling_ratio: int, aligned: bool, mode: str = 'avg') -> torch.Tensor:
    """RoIAlign written out one sample point at a time (mmcv's formula)."""
    offset = 0.5 if aligned else 0.0
    out = []
    for batch, *box in rois.tolist():
        x1, y1, x2, y2 = (v * scale - offset for v in box)
        roi_w, roi_h = x2 - x1, y2 - y1
        if not aligned:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_w, bin_h = roi_w / size, roi_h / size
        grid_h = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_h / size)
        grid_w = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_w / size)
        bins = [[_pool([_bilinear(feats[int(batch)], y1 + ph * bin_h + (iy + 0.5) * bin_h / grid_h,
                                  x1 + pw * bin_w + (ix + 0.5) * bin_w / grid_w)
                        for iy in range(grid_h) for ix in range(grid_w)], mode, feats[0, :, 0, 0])
                 for pw in range(size)] for ph in range(size)]
        out.append(torch.stack([torch.stack(row, -1) for row in bins], -2))
    return torch.stack(out)


@pytest.mark.parametrize('mode', ['avg', 'max'])
@pytest.mark.parametrize('sampling_ratio', [0, 2])
@pytest.mark.parametrize('aligned', [True, False])
@pytest.mark.parametrize('scale', [1.0, 0.25])
def test_roi_align_forward_backward_equal_the_formula(aligned, sampling_ratio, scale, mode):
    feats = torch.randn(2, 3, 24, 32, dtype=torch.float64, requires_grad=True)
    rois = _roi_cases().double()
    rois[:, 1:] /= scale
    out = mmcv.ops.roi_align(feats, rois, (5, 5), scale, sampling_ratio, mode, aligned)
    ref_feats = feats.detach().clone().requires_grad_()
    ref = _reference_roi_align(ref_feats, rois, 5, scale, sampling_ratio, aligned, mode)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad)
    torch.testing.assert_close(feats.grad, ref_feats.grad, rtol=0, atol=1e-10)


def test_roi_align_gradient_is_the_derivative():
    feats = torch.randn(2, 2, 9, 11, dtype=torch.float64, requires_grad=True)
    rois = torch.tensor([[0, 1.2, 0.7, 6.3, 8.1], [1, -1.0, 2.0, 12.0, 5.5]], dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda x: mmcv.ops.roi_align(x, rois, (3, 4), 1.0, 0, 'avg', True), (feats,))


def test_roi_align_max_float32_and_float16_against_float64():
    feats = torch.randn(2, 3, 24, 32, generator=torch.Generator().manual_seed(1))
    rois = _roi_cases()

    def pooled(dtype):
        return mmcv.ops.roi_align(feats.to(dtype), rois.to(dtype), (5, 5), 1.0, 0, 'max', True)
    exact, full, half = pooled(torch.float64), pooled(torch.float32), pooled(torch.float16)
    empty = exact == -_FLT_MAX   # the bins of the degenerate RoIs: no sample point
    assert empty.any() and (full[empty] == -_FLT_MAX).all()
    assert (half[empty] == float('-inf')).all()   # -FLT_MAX converted to float16
    assert full.dtype == torch.float32 and half.dtype == torch.float16
    assert (full[~empty].double() - exact[~empty]).abs().max() <= 1e-5 * exact[~empty].abs().max()
    # float16 rounds the inputs (the RoIs too) and the interpolation
    torch.testing.assert_close(half[~empty].double(), exact[~empty], rtol=0, atol=3e-2)


def test_roi_align_empty_rois_and_float16():
    feats = torch.randn(2, 4, 16, 16, generator=torch.Generator().manual_seed(0))
    empty = mmcv.ops.roi_align(feats, torch.zeros(0, 5), (7, 7), 1.0, 0, 'avg', True)
    assert empty.shape == (0, 4, 7, 7)
    rois = _roi_cases()[:3]
    half = mmcv.ops.roi_align(feats.half(), rois.half(), (7, 7), 0.5, 0, 'avg', True)
    assert half.dtype == torch.float16
    # the same inputs in float32: differences are half-precision rounding of the sums
    full = mmcv.ops.roi_align(feats.half().float(), rois.half().float(), (7, 7), 0.5, 0, 'avg',
                              True)
    torch.testing.assert_close(half.float(), full, rtol=0, atol=2e-2)


def test_roi_align_bfloat16_samples_where_float32_does():
    """bfloat16 features and RoIs pool (and back-propagate) at float32's sample points: only
    the results are rounded to bfloat16."""
    feats, grad = (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()
                   for shape, seed in (((2, 4, 40, 48), 0), ((2, 4, 7, 7), 1)))
    rois = torch.tensor([[0, 2.0, 3.0, 70.0, 54.0], [1, 5.5, 1.75, 93.0, 76.0]])
    results = {}
    for dtype in (torch.bfloat16, torch.float32):
        x = feats.to(dtype).detach().requires_grad_()
        out = mmcv.ops.roi_align(x, rois.to(dtype), (7, 7), 0.5, 2, 'avg', True)
        out.backward(grad.to(dtype))
        assert out.dtype == x.grad.dtype == dtype
        results[dtype] = out.float(), x.grad.float()
    for low, full in zip(results[torch.bfloat16], results[torch.float32]):
        # the inputs are bfloat16's in both runs, so the one difference is the rounding
        torch.testing.assert_close(low, full.bfloat16().float(), rtol=0, atol=0)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_roi_align_max_in_low_precision_picks_among_float32_samples(dtype):
    """float16 and bfloat16 features and RoIs pool (and back-propagate) as float32 does on the
    same values: the same sample of each bin, its gradient at float32's sample point; only
    the results are rounded."""
    feats, grad = (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
                   for shape, seed in (((2, 3, 24, 32), 1), ((len(_roi_cases()), 3, 5, 5), 2)))
    rois = _roi_cases().to(dtype)
    results = {}
    for run in (dtype, torch.float32):
        x = feats.to(run).detach().requires_grad_()
        out = mmcv.ops.roi_align(x, rois.to(run), (5, 5), 1.0, 0, 'max', True)
        out.backward(grad.to(run))
        assert out.dtype == x.grad.dtype == run
        results[run] = out, x.grad
    for low, full in zip(results[dtype], results[torch.float32]):
        assert torch.equal(low, full.to(dtype))


def test_other_ops_exist_and_raise_naming_the_op():
    with pytest.raises(MissingCompiledOpError, match=r"'carafe_forward'.*mmcv_ops.md.*--full"):
        mmcv.ops.carafe(torch.rand(1, 4, 4, 4), torch.rand(1, 9, 8, 8), 3, 1, 2)
    with pytest.raises(MissingCompiledOpError, match="'deform_roi_pool_forward'"):
        mmcv_ext.deform_roi_pool_forward()
    with pytest.raises(AttributeError):
        mmcv_ext.__wrapped__  # noqa: B018  (dunders are not ops)


def test_deformable_attention_and_max_roi_align_read_no_value_on_the_host():
    """No host synchronisation in the forward and backward of multi-scale deformable attention
    and of max-pooled RoIAlign with a fixed sampling ratio: under fake tensors, which hold no
    values, a read of one (``.item()``, ``.tolist()``, a boolean mask) raises.  The adaptive
    sampling ratio needs its largest count, and says so by raising."""
    from mmcv.ops.multi_scale_deform_attn import MultiScaleDeformableAttnFunction
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode
    with FakeTensorMode():
        value = torch.randn(2, 40, 2, 4, requires_grad=True)
        locations = torch.rand(2, 5, 2, 2, 3, 2, requires_grad=True)
        weights = torch.rand(2, 5, 2, 2, 3, requires_grad=True)
        out = MultiScaleDeformableAttnFunction.apply(
            value, torch.tensor([[4, 8], [2, 4]]), torch.tensor([0, 32]), locations, weights, 64)
        out.sum().backward()
        assert out.shape == (2, 5, 8) and locations.grad.shape == locations.shape
        x = torch.randn(2, 3, 8, 8, requires_grad=True)
        rois = torch.rand(4, 5)
        pooled = mmcv.ops.roi_align(x, rois, 2, 1.0, 2, 'max', True)
        pooled.sum().backward()
        assert pooled.shape == (4, 3, 2, 2) and x.grad.shape == x.shape
        with pytest.raises(DataDependentOutputException):
            mmcv.ops.roi_align(x, rois, 2, 1.0, 0, 'max', True)
