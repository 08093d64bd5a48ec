"""Torch-native stand-in for mmcv's compiled ``mmcv._ext``, for the ops the hosts' heads call.

Symptom: mmcv 2.1.0 has no wheel for torch 2.14 and its source build needs a C++ compiler
(and nvcc on a GPU machine); ``mmcv-lite`` is the same Python code without ``mmcv._ext``,
and mmdet 3.3 / mmseg 1.2 import ``mmcv.ops``, which loads ``mmcv._ext`` and checks that
every function each op module names exists, so neither imports.

Fix: this module is loaded *as* ``mmcv._ext`` (after :func:`vitdense.compat.apply_host_fixes`)
when no compiled extension is installed.  It serves, on any device, the compiled functions
that mmdet's and mmseg's shipped configs reach and that torch or torchvision compute exactly
(``docs/mmcv_ops.md`` has the inventory): ``nms``, soft-NMS, ``nms_match``,
RoIAlign (average and max pooling), the sigmoid and softmax focal losses, multi-scale
deformable attention, deformable and modulated deformable convolution, masked
convolution and PSANet's attention masks.  Each function
takes the arguments mmcv's Python wrappers pass to the compiled one and writes the output and
gradient buffers it is handed in place, as the CUDA kernels do; it computes in the dtypes it is
given, outside autocast and autograd, as a compiled kernel does.
Every other name resolves to a function that raises :class:`MissingCompiledOpError`
(defined in ``vitdense.compat``, so that it is one class however this file was loaded).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, NoReturn, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
import torchvision  # noqa: F401  (registers torch.ops.torchvision)
from torch import Tensor

# loaded as mmcv._ext: the finder module is in sys.modules, vitdense itself need not be
from vitdense.compat.mmcv_finder import MissingCompiledOpError

__all__ = ['MissingCompiledOpError', 'IMPLEMENTED', 'nms', 'softnms', 'nms_match',
           'roi_align_forward', 'roi_align_backward', 'sigmoid_focal_loss_forward',
           'sigmoid_focal_loss_backward',
           'softmax_focal_loss_forward', 'softmax_focal_loss_backward',
           'ms_deform_attn_forward', 'ms_deform_attn_backward', 'deform_conv_forward',
           'deform_conv_backward_input', 'deform_conv_backward_parameters',
           'modulated_deform_conv_forward', 'modulated_deform_conv_backward',
           'masked_im2col_forward', 'masked_col2im_forward', 'psamask_forward',
           'psamask_backward', 'get_compiler_version', 'get_compiling_cuda_version']

BACKEND = MissingCompiledOpError.BACKEND

# mmcv's pool_mode codes (``RoIAlignFunction``): 0 is max, 1 is avg.
_POOL_MAX = 0
# mmcv's soft-NMS methods (``soft_nms``): 0 naive, 1 linear, 2 gaussian
_SOFTNMS_NAIVE, _SOFTNMS_GAUSSIAN = 0, 2
# the CUDA kernels' float limits, in every dtype: log's argument is clamped at FLT_MIN and an
# empty max-pooling bin holds -FLT_MAX
_FLT_MIN = torch.finfo(torch.float32).tiny
_FLT_MAX = torch.finfo(torch.float32).max
# where the deformable kernels' backward moves a sample point they read as outside the map
_OUTSIDE = -2.0

_Op = TypeVar('_Op', bound=Callable[..., Any])


def _kernel(op: _Op) -> _Op:
    """Run ``op`` as a compiled kernel runs: in the dtypes of its tensors (autocast off) and
    outside autograd (what it needs of autograd it enables itself)."""
    @functools.wraps(op)
    def kernel(*args: Any, **kwargs: Any) -> Any:
        device = next(a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)).device
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            return op(*args, **kwargs)
    return kernel  # type: ignore[return-value]


def nms(boxes: Tensor, scores: Tensor, iou_threshold: float, offset: int) -> Tensor:
    """Indices of the boxes kept by greedy NMS, in descending score order (mmcv ``nms``).

    Boxes are visited by descending score, as in mmcv's kernels, and boxes of equal score by
    ascending index (a stable sort: mmcv's kernels sort unstably, which leaves the order of
    ties, and so which of two overlapping equal-score boxes survives, unspecified);
    torchvision's kernel is handed that order as strictly decreasing ranks, so that it
    keeps this order and the kept positions come back ascending.  The ranks and boxes go to
    it in float32 at least (its boxes and scores share a dtype, and float16 holds distinct
    integers only up to 2,048).  ``offset=1`` (the legacy pixel convention, width
    ``x2 - x1 + 1``) is the same as moving every box's far corner by one pixel.
    """
    if boxes.numel() == 0:
        return boxes.new_empty(0, dtype=torch.long)
    order = scores.sort(stable=True, dim=0, descending=True)[1]
    ordered = boxes.index_select(0, order)
    if offset:
        ordered = torch.cat([ordered[:, :2], ordered[:, 2:4] + offset], dim=1)
    ordered = ordered.to(torch.promote_types(ordered.dtype, torch.float32))
    ranks = torch.arange(len(order), 0, -1, device=boxes.device, dtype=ordered.dtype)
    kept = torch.ops.torchvision.nms(ordered, ranks, float(iou_threshold))
    return order[kept]


@_kernel
def nms_match(dets: Tensor, iou_threshold: float) -> list[list[int]]:
    """Greedy NMS that returns what each kept box suppressed (mmcv ``nms_match``, PISA's
    sampler): for each box of ``dets`` (N, 5: box, score) by descending score (equal scores by
    index, as in :func:`nms`) not yet suppressed, a group of its index followed by those of the
    boxes after it not yet suppressed with IoU >= ``iou_threshold``, which it suppresses."""
    areas = (dets[:, 2] - dets[:, 0]) * (dets[:, 3] - dets[:, 1])
    order = dets[:, 4].sort(stable=True, descending=True)[1]
    boxes, areas = dets[order, :4], areas[order]
    low = torch.maximum(boxes[:, None, :2], boxes[None, :, :2])
    high = torch.minimum(boxes[:, None, 2:], boxes[None, :, 2:])
    inter = (high - low).clamp(min=0).prod(-1)
    matches = inter / (areas[:, None] + areas[None, :] - inter) >= iou_threshold
    suppressed = torch.zeros(len(order), dtype=torch.bool, device=dets.device)
    groups = []
    for i in range(len(order)):
        if suppressed[i]:
            continue
        members = matches[i] & ~suppressed
        members[:i + 1] = False
        suppressed |= members
        groups.append(order[i:i + 1].tolist() + order[members].tolist())
    return groups


def _softnms_decay(overlap: np.ndarray, iou_threshold: float, sigma: float,
                   method: int) -> np.ndarray:
    """Soft-NMS's score factor for each overlap with the kept box: 0 (``naive``: hard NMS),
    ``1 - IoU`` (``linear``) at IoU >= the threshold, or ``exp(-IoU^2 / sigma)``
    (``gaussian``)."""
    if method == _SOFTNMS_GAUSSIAN:
        return np.exp(-(overlap * overlap) / sigma)
    suppressed = np.zeros_like(overlap) if method == _SOFTNMS_NAIVE else 1 - overlap
    return np.where(overlap >= iou_threshold, suppressed, np.ones_like(overlap))


def _drop_like_softnms(dropped: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """How mmcv's kernel closes the gaps of the ``dropped`` positions (ascending) among
    ``count`` entries: it fills each dropped entry before the new end, first to last, with the
    last entry still alive.  Returns the holes and the positions that fill them."""
    kept = count - len(dropped)
    holes = dropped[dropped < kept]
    alive_after = np.ones(count - kept, dtype=bool)
    alive_after[dropped[dropped >= kept] - kept] = False
    return holes, np.flatnonzero(alive_after)[::-1] + kept


@_kernel
def softnms(boxes: Tensor, scores: Tensor, dets: Tensor, iou_threshold: float, sigma: float,
            min_score: float, method: int, offset: int) -> Tensor:
    """Soft-NMS (Bodla et al., 2017) as mmcv's kernel runs it: repeatedly keep the
    highest-scoring box left (the first of equals), write it and its score into the next row
    of ``dets`` and decay the scores of the boxes after it by their overlap with it; a box
    whose score falls below ``min_score`` is dropped.  Returns the kept indices.

    mmcv runs it on the CPU: each step is one vectorised pass over the boxes left, in NumPy
    (in the boxes' dtype; bfloat16, which NumPy lacks, in float32), whose per-call cost is a
    fraction of torch's on the small arrays of the late steps.
    """
    if boxes.numel() == 0:
        return boxes.new_empty(0, dtype=torch.long)
    as_numpy = torch.float32 if boxes.dtype == torch.bfloat16 else boxes.dtype
    # the kernel's arrays, permuted as it permutes them: x1, y1, x2, y2, score, area (one
    # array, so that a swap is one call) and the boxes' indices
    state = np.empty((6, len(boxes)), dtype=torch.empty(0, dtype=as_numpy).numpy().dtype)
    state[:4] = boxes.to(as_numpy).numpy().T
    state[4] = scores.to(as_numpy).numpy()
    x1, y1, x2, y2, score, area = state
    area[:] = (x2 - x1 + offset) * (y2 - y1 + offset)
    index = np.arange(len(boxes))
    rows = np.empty((len(boxes), 5), dtype=state.dtype)
    left, i = len(boxes), 0
    while i < left:
        best = i + int(score[i:left].argmax())   # the first of equal scores
        state[:, [i, best]] = state[:, [best, i]]
        index[[i, best]] = index[[best, i]]
        rows[i] = state[:5, i]
        rest = slice(i + 1, left)
        width = np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]) + offset
        height = np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]) + offset
        inter = np.maximum(width, 0) * np.maximum(height, 0)
        overlap = inter / (area[i] + area[rest] - inter)
        score[rest] *= _softnms_decay(overlap, iou_threshold, sigma, method)
        dropped = np.flatnonzero(score[rest] < min_score)
        if len(dropped):
            holes, fillers = _drop_like_softnms(dropped, left - i - 1)
            state[:, i + 1 + holes] = state[:, i + 1 + fillers]
            index[i + 1 + holes] = index[i + 1 + fillers]
            left -= len(dropped)
        i += 1
    dets[:left].copy_(torch.from_numpy(rows[:left]))
    return torch.from_numpy(index[:left])


# --- RoIAlign -------------------------------------------------------------------------------

def _bilinear_corners(y: Tensor, x: Tensor, height: int, width: int
                      ) -> tuple[list[Tensor], list[Tensor]]:
    """mmcv RoIAlign's bilinear interpolation at points (y, x): the four corners' flat indices
    ``y * width + x`` and their weights, the weights zero for points outside
    [-1, height] x [-1, width]; points in the last pixel row or column read that pixel."""
    inside = (y >= -1) & (y <= height) & (x >= -1) & (x <= width)
    corners, fractions = [], []
    for coord, size in ((y, height), (x, width)):
        coord = coord.clamp(min=0)
        low = coord.floor().clamp(max=size - 1)
        coord = torch.where(coord >= size - 1, low, coord)
        corners.append((low, (low + 1).clamp(max=size - 1)))
        fractions.append(coord - low)
    (y_low, y_high), (x_low, x_high) = corners
    ly, lx = fractions
    hy, hx = 1 - ly, 1 - lx
    index = [(yy * width + xx).long() for yy in (y_low, y_high) for xx in (x_low, x_high)]
    weights = [w * inside for w in (hy * hx, hy * lx, ly * hx, ly * lx)]
    return index, weights


def _roi_grid(rois: Tensor, spatial_scale: float, bins_hw: tuple[int, int],
              sampling_ratio: int, aligned: bool) -> tuple[list[Tensor], list[Tensor]]:
    """mmcv's sampling points of each RoI, y then x: the coordinates (K, bins, most samples per
    bin) and the number of samples per bin of each RoI (K,).  A fixed ``sampling_ratio``
    fixes the grid; the adaptive one (0) waits once for the device, for the largest count."""
    start = rois[:, 1:3] * spatial_scale - (0.5 if aligned else 0.0)
    size = rois[:, 3:5] * spatial_scale - (0.5 if aligned else 0.0) - start
    if not aligned:
        size = size.clamp(min=1.0)
    points, counts = [], []
    for axis, bins in ((1, bins_hw[0]), (0, bins_hw[1])):
        bin_size = size[:, axis] / bins
        count = (torch.full_like(bin_size, sampling_ratio) if sampling_ratio > 0
                 else torch.ceil(size[:, axis] / bins)).long().clamp(min=0)
        most = sampling_ratio if sampling_ratio > 0 else int(count.max()) if len(count) else 0
        steps = torch.arange(most, device=rois.device)
        bin_start = (start[:, axis, None]
                     + torch.arange(bins, device=rois.device) * bin_size[:, None])
        points.append(bin_start[:, :, None]
                      + (steps + 0.5) * (bin_size / count.clamp(min=1))[:, None, None])
        counts.append(count)
    return points, counts


def _roi_align_max(input: Tensor, rois: Tensor, bins_hw: tuple[int, int], spatial_scale: float,
                   sampling_ratio: int, aligned: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Max-pooled RoIAlign: per bin, the largest bilinear sample (the first of equals, samples
    visited row by row) and its sample's row and column in the bin; an empty bin holds
    -FLT_MAX at (-1, -1). The samples are computed and compared in float32 at least: a
    float16 or bfloat16 input rounds only the maximum, not which sample it is, and the
    indices (small integers) are exact in any dtype where a coordinate would not be."""
    _, channels, height, width = input.shape
    dtype = torch.promote_types(input.dtype, torch.float32)
    (ys, xs), (count_y, count_x) = _roi_grid(rois.to(dtype), spatial_scale, bins_hw,
                                             sampling_ratio, aligned)
    pixels = input.to(dtype).permute(0, 2, 3, 1).reshape(-1, channels)   # (batch * H * W, C)
    first_pixel = (rois[:, 0].long() * height * width)[:, None, None]
    best = pixels.new_full((len(rois), channels, *bins_hw), -_FLT_MAX)
    best_row, best_col = torch.full_like(best, -1.0), torch.full_like(best, -1.0)
    for iy in range(ys.shape[-1]):
        for ix in range(xs.shape[-1]):
            y = ys[:, :, None, iy].expand(-1, -1, bins_hw[1])
            x = xs[:, None, :, ix].expand(-1, bins_hw[0], -1)
            index, weights = _bilinear_corners(y, x, height, width)
            value = sum(w[..., None] * pixels[first_pixel + i] for i, w in zip(index, weights))
            taken = (iy < count_y) & (ix < count_x)
            better = (value.permute(0, 3, 1, 2) > best) & taken[:, None, None, None]
            best = torch.where(better, value.permute(0, 3, 1, 2), best)
            best_row = best_row.masked_fill(better, iy)
            best_col = best_col.masked_fill(better, ix)
    # -FLT_MAX in the input's dtype, as the kernel converts it: -inf in float16
    return best.to(input.dtype), best_row, best_col


@_kernel
def roi_align_forward(input: Tensor, rois: Tensor, output: Tensor, argmax_y: Tensor,
                      argmax_x: Tensor, aligned_height: int, aligned_width: int,
                      spatial_scale: float, sampling_ratio: int, pool_mode: int,
                      aligned: bool) -> None:
    """RoIAlign of ``rois`` (K, 5: batch index, x1, y1, x2, y2) into ``output``: averaged on
    torchvision's kernel, or max-pooled with each maximum's sample row and column in its bin
    in ``argmax_y/x`` (the compiled kernel stores the sample's coordinates there; only the
    backward below reads them, and the coordinates rounded to a float16 or bfloat16 buffer
    would misplace the gradient)."""
    if pool_mode == _POOL_MAX:
        pooled, best_row, best_col = _roi_align_max(
            input, rois, (int(aligned_height), int(aligned_width)), float(spatial_scale),
            int(sampling_ratio), bool(aligned))
        argmax_y.copy_(best_row)
        argmax_x.copy_(best_col)
    else:
        dtype = _roi_align_dtype(input.dtype)
        pooled = torch.ops.torchvision.roi_align(
            input.to(dtype), rois.to(dtype), float(spatial_scale), int(aligned_height),
            int(aligned_width), int(sampling_ratio), bool(aligned))
    output.copy_(pooled)


def _roi_align_dtype(dtype: torch.dtype) -> torch.dtype:
    """The type torchvision's average RoIAlign computes in: bfloat16's 8 bits would place the
    sample points up to a pixel off at a few hundred pixels (and its CPU kernel has none), so
    bfloat16 runs in float32; float16 runs in float16, as mmcv's compiled kernel does."""
    return torch.float32 if dtype == torch.bfloat16 else dtype


@contextlib.contextmanager
def _atomic_adds_allowed(device: torch.device) -> Iterator[None]:
    """Under ``torch.use_deterministic_algorithms(True)``, warn instead of failing on CUDA.

    The backward kernels of RoIAlign, deformable attention (``grid_sample``'s) and deformable
    convolution scatter with atomic adds on CUDA, mmcv's as well as torch's and
    torchvision's; mmcv's run regardless, torch's and torchvision's raise in deterministic
    mode.  Here they run like mmcv's, and torch warns that the result is not deterministic.
    """
    relax = (device.type == 'cuda' and torch.are_deterministic_algorithms_enabled()
             and not torch.is_deterministic_algorithms_warn_only_enabled())
    if relax:
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        if relax:
            torch.use_deterministic_algorithms(True)


def _roi_align_max_backward(grad_output: Tensor, rois: Tensor, best_row: Tensor,
                            best_col: Tensor, grad_input: Tensor, spatial_scale: float,
                            sampling_ratio: int, aligned: bool) -> None:
    """Adds each bin's gradient to the four pixels around its maximum's sample point, the
    point recomputed in float32 at least from the RoI and the sample's row and column (as
    the forward computed it); a maximum sampled at y = -1 exactly gets none, as in mmcv's
    kernel, which reads y = -1 as the mark of an empty bin."""
    _, channels, height, width = grad_input.shape
    dtype = torch.promote_types(grad_output.dtype, torch.float32)
    bins_hw = tuple(grad_output.shape[2:])
    (ys, xs), _ = _roi_grid(rois.to(dtype), spatial_scale, bins_hw, sampling_ratio, aligned)
    if not ys.shape[-1] or not xs.shape[-1]:
        return   # no RoI has a sample
    rows, cols = best_row.long(), best_col.long()
    sampled = rows >= 0
    k, c, bh, bw = rows.shape
    y = ys[:, None, :, None, :].expand(k, c, bh, bw, -1).gather(
        -1, rows.clamp(min=0)[..., None])[..., 0]
    x = xs[:, None, None, :, :].expand(k, c, bh, bw, -1).gather(
        -1, cols.clamp(min=0)[..., None])[..., 0]
    sampled &= y != -1
    index, weights = _bilinear_corners(y, x, height, width)
    first_pixel = ((rois[:, 0].long() * channels)[:, None]
                   + torch.arange(channels, device=rois.device)) * (height * width)
    grad = torch.zeros(grad_input.numel(), dtype=dtype, device=grad_input.device)
    for i, w in zip(index, weights):   # a bin without a sample adds 0 (no sync to skip it)
        grad.index_put_(((first_pixel[:, :, None, None] + i).flatten(),),
                        (grad_output.to(dtype) * w * sampled).flatten(), accumulate=True)
    grad_input.add_(grad.view_as(grad_input))


@_kernel
def roi_align_backward(grad_output: Tensor, rois: Tensor, argmax_y: Tensor, argmax_x: Tensor,
                       grad_input: Tensor, aligned_height: int, aligned_width: int,
                       spatial_scale: float, sampling_ratio: int, pool_mode: int,
                       aligned: bool) -> None:
    """Adds the gradient of RoIAlign with respect to its input to ``grad_input``."""
    if pool_mode == _POOL_MAX:
        _roi_align_max_backward(grad_output, rois, argmax_y, argmax_x, grad_input,
                                float(spatial_scale), int(sampling_ratio), bool(aligned))
        return
    batch, channels, height, width = grad_input.shape
    dtype = _roi_align_dtype(grad_output.dtype)
    with _atomic_adds_allowed(grad_output.device):
        grad = torch.ops.torchvision._roi_align_backward(
            grad_output.to(dtype), rois.to(dtype), float(spatial_scale), int(aligned_height),
            int(aligned_width), batch, channels, height, width, int(sampling_ratio),
            bool(aligned))
    grad_input.add_(grad)


# --- focal losses ---------------------------------------------------------------------------

def _class_weights(weight: Tensor, target: Tensor, num_classes: int, op: str) -> Tensor | None:
    """``weight[target]`` (the kernels' per-row class weight), None for no weight; a target
    past the weight's entries (which the CUDA kernels read out of bounds) raises."""
    if weight.numel() == 0:
        return None
    if bool((target >= num_classes).any()):
        raise ValueError(
            f'{op}: a target is {int(target.max())} but the class weight has {num_classes} '
            'entries (the compiled kernel would read past them); pass weight=None and weigh '
            'the loss afterwards, as mmdet\'s FocalLoss does')
    return weight[target.clamp(min=0)]


def _sigmoid_focal(input: Tensor, target: Tensor, weight: Tensor, gamma: float, alpha: float,
                   derivative: bool) -> Tensor:
    """mmcv's sigmoid focal loss per element, or its derivative by the logit; ``target`` is a
    class index per row, ``num_classes`` meaning background."""
    p = input.sigmoid()
    log_p, log_q = p.clamp(min=_FLT_MIN).log(), (1 - p).clamp(min=_FLT_MIN).log()
    if derivative:
        positive = (1 - p).pow(gamma) * (1 - p - gamma * p * log_p)
        negative = p.pow(gamma) * (gamma * (1 - p) * log_q - p)
    else:
        positive, negative = (1 - p).pow(gamma) * log_p, p.pow(gamma) * log_q
    is_target = target[:, None] == torch.arange(input.shape[1], device=input.device)
    loss = torch.where(is_target, -alpha * positive, -(1 - alpha) * negative)
    class_weight = _class_weights(weight, target, input.shape[1], 'sigmoid_focal_loss')
    return loss if class_weight is None else loss * class_weight[:, None]


@_kernel
def sigmoid_focal_loss_forward(input: Tensor, target: Tensor, weight: Tensor, output: Tensor,
                               gamma: float, alpha: float) -> None:
    """The sigmoid focal loss of each logit of ``input`` (N, C) into ``output``."""
    output.copy_(_sigmoid_focal(input, target, weight, gamma, alpha, derivative=False))


@_kernel
def sigmoid_focal_loss_backward(input: Tensor, target: Tensor, weight: Tensor,
                                grad_input: Tensor, gamma: float, alpha: float) -> None:
    """The derivative of each element's sigmoid focal loss by its logit into ``grad_input``."""
    grad_input.copy_(_sigmoid_focal(input, target, weight, gamma, alpha, derivative=True))


def _target_probability(softmax: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's probability of its target class and whether the row has one (target >= 0);
    a target past the classes raises."""
    if bool((target >= softmax.shape[1]).any()):
        raise ValueError(f'softmax_focal_loss: a target is {int(target.max())} but there are '
                         f'{softmax.shape[1]} classes (targets are 0..C-1, or negative to '
                         'ignore the row)')
    return softmax.gather(1, target.clamp(min=0)[:, None])[:, 0], target >= 0


def _softmax_focal_weighted(per_row: Tensor, target: Tensor, weight: Tensor,
                            labelled: Tensor) -> Tensor:
    """``per_row`` with rows without a target zeroed and the class weight applied."""
    class_weight = _class_weights(weight, target, len(weight), 'softmax_focal_loss')
    per_row = per_row if class_weight is None else per_row * class_weight
    return torch.where(labelled, per_row, torch.zeros_like(per_row))


@_kernel
def softmax_focal_loss_forward(softmax: Tensor, target: Tensor, weight: Tensor, output: Tensor,
                               gamma: float, alpha: float) -> None:
    """Each row's softmax focal loss, ``-alpha (1 - p)^gamma log p`` of its target's
    probability ``p``, into ``output`` (N,)."""
    p, labelled = _target_probability(softmax, target)
    loss = -alpha * (1 - p).pow(gamma) * p.clamp(min=_FLT_MIN).log()
    output.copy_(_softmax_focal_weighted(loss, target, weight, labelled))


@_kernel
def softmax_focal_loss_backward(softmax: Tensor, target: Tensor, weight: Tensor, buff: Tensor,
                                grad_input: Tensor, gamma: float, alpha: float) -> None:
    """The derivative by the logits into ``grad_input`` (N, C), through ``buff`` (N,), the
    derivative by the target's log-probability, as mmcv's two kernels pass it."""
    p, labelled = _target_probability(softmax, target)
    by_log_p = alpha * (-(1 - p).pow(gamma)
                        + gamma * (1 - p).pow(gamma - 1) * p * p.clamp(min=_FLT_MIN).log())
    buff.copy_(_softmax_focal_weighted(by_log_p, target, weight, labelled))
    is_target = target[:, None] == torch.arange(softmax.shape[1], device=softmax.device)
    grad = buff[:, None] * (is_target.to(softmax.dtype) - softmax)
    grad_input.copy_(torch.where(labelled[:, None], grad, torch.zeros_like(grad)))


# --- multi-scale deformable attention -------------------------------------------------------

def _deform_attn_level(values: Tensor, keys: int, shape_hw: Tensor, start: Tensor,
                       locations: Tensor, weights: Tensor) -> Tensor:
    """One level's share of the output, (batch, heads, queries, dims), by mmcv's kernel's
    formula: each point is read bilinearly at pixel ``(loc_y * H - 0.5, loc_x * W - 0.5)``;
    a point with ``y <= -1``, ``y >= H``, ``x <= -1`` or ``x >= W`` (or NaN) reads 0 and
    passes no gradient, a corner beyond the map reads 0.

    ``values`` is the value (batch * heads * keys, dims), flat; ``locations`` (batch,
    queries, heads, points, x y) and ``weights`` (batch, queries, heads, points) are the
    level's.  The level's place (``shape_hw``, ``start``) stays on the device: nothing here
    waits for the device.
    """
    batch, _, heads, _ = weights.shape
    rows, cols = shape_hw.unbind()
    height, width = rows.to(locations.dtype), cols.to(locations.dtype)
    loc = locations.permute(0, 2, 1, 3, 4)                        # (B, heads, Q, P, 2)
    y, x = loc[..., 1] * height - 0.5, loc[..., 0] * width - 0.5
    inside = (y > -1) & (x > -1) & (y < height) & (x < width)
    y = torch.where(inside, y, _OUTSIDE)
    x = torch.where(inside, x, _OUTSIDE)
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


def _flat_value(value: Tensor) -> Tensor:
    """(batch, keys, heads, dims) as (batch * heads * keys, dims), each head's keys together."""
    return value.permute(0, 2, 1, 3).reshape(-1, value.shape[-1])


@_kernel
def ms_deform_attn_forward(value: Tensor, value_spatial_shapes: Tensor,
                           value_level_start_index: Tensor, sampling_locations: Tensor,
                           attention_weights: Tensor, im2col_step: int) -> Tensor:
    """Multi-scale deformable attention, (batch, queries, heads * dims), level by level: the
    largest intermediate is one level's samples.  ``im2col_step`` (the CUDA kernel's batch
    chunk) changes nothing in the result."""
    batch, keys, heads, dims = value.shape
    values = _flat_value(value)
    output = sum(_deform_attn_level(values, keys, value_spatial_shapes[level],
                                    value_level_start_index[level],
                                    sampling_locations[:, :, :, level],
                                    attention_weights[:, :, :, level])
                 for level in range(len(value_spatial_shapes)))
    return output.permute(0, 2, 1, 3).reshape(batch, -1, heads * dims)


@_kernel
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
    values = _flat_value(value).requires_grad_()
    grad_values = torch.zeros_like(values)
    for level in range(len(value_spatial_shapes)):
        locations, weights = (t[:, :, :, level].detach().requires_grad_()
                              for t in (sampling_locations, attention_weights))
        with torch.enable_grad():
            share = _deform_attn_level(values, keys, value_spatial_shapes[level],
                                       value_level_start_index[level], locations, weights)
        with _atomic_adds_allowed(value.device):
            by_values, by_locations, by_weights = torch.autograd.grad(
                share, (values, locations, weights), grad_share)
        grad_values += by_values
        grad_sampling_loc[:, :, :, level] += by_locations
        grad_attn_weight[:, :, :, level] += by_weights
    grad_value += grad_values.view(batch, heads, keys, dims).transpose(1, 2)


# --- deformable convolution -----------------------------------------------------------------

def _read_per_sample(buffer: Tensor, channels: int, out_hw: tuple[int, int], strict: bool,
                     op: str, name: str) -> Tensor:
    """``buffer`` (N, ...) as (N, channels, H_out, W_out): each sample's first values, as the
    compiled kernels read it; a buffer of another shape raises if ``strict``, and one with
    too few values always does."""
    shape = (channels, *out_hw)
    if buffer.shape[1:] == shape:
        return buffer
    needed = channels * out_hw[0] * out_hw[1]
    if strict or buffer[0].numel() < needed:
        raise ValueError(
            f'{op}: the {name} is {tuple(buffer.shape)}, but the kernel reads '
            f'{channels} x {out_hw[0]} x {out_hw[1]} values of each sample (deformable groups '
            f'x kernel taps{" x 2" if name == "offset" else ""}, output height, output width)'
            + ('' if strict else f' and it holds {buffer[0].numel()}'))
    return buffer.reshape(len(buffer), -1)[:, :needed].reshape(len(buffer), *shape)


def _kernel_offsets(input: Tensor, offset: Tensor, mask: Tensor | None, kernel_hw: tuple[int, int],
                    out_hw: tuple[int, int], geometry: tuple[int, ...], op: str
                    ) -> tuple[Tensor, Tensor | None]:
    """The offsets (and mask) as the compiled kernels read them, for torchvision's kernels.

    Layout: DCNv2's kernel reads each sample's first ``C x H_out x W_out`` offset and mask
    values with the output's layout, whatever the buffer's shape (DyHead computes them on a
    map twice the output's size); DCNv1's checks the offset's shape.

    Edges: a tap at ``y <= -1``, ``y >= H``, ``x <= -1`` or ``x >= W`` reads 0 and passes no
    gradient to its offset or the input; the kernels move such a tap to (-2, -2).
    torchvision's kernels differ at exactly -1 (a one-sided derivative by the offset) and
    fail on NaN, so the offset of every such tap is replaced by the one that puts it at
    (-2, -2), where both read and pass nothing. A NaN tap is moved too: it reads 0 and passes
    a gradient of 0, where the compiled backward passes NaN.
    """
    batch, _, height, width = input.shape
    kh, kw = kernel_hw
    stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, _, deform_groups = geometry
    taps = deform_groups * kh * kw
    strict = mask is None   # DCNv1's kernel checks the offset's shape
    offset = _read_per_sample(offset, 2 * taps, out_hw, strict, op, 'offset')
    mask = None if mask is None else _read_per_sample(mask, taps, out_hw, strict, op, 'mask')
    pos = offset.reshape(batch, deform_groups, kh, kw, 2, *out_hw)
    rows = torch.arange(out_hw[0], device=offset.device) * stride_h - pad_h
    cols = torch.arange(out_hw[1], device=offset.device) * stride_w - pad_w
    base_y = (rows + dil_h * torch.arange(kh, device=offset.device)[:, None])[:, None, :, None]
    base_x = (cols + dil_w * torch.arange(kw, device=offset.device)[:, None])[None, :, None, :]
    y, x = base_y + pos[:, :, :, :, 0], base_x + pos[:, :, :, :, 1]
    inside = (y > -1) & (y < height) & (x > -1) & (x < width)
    moved = torch.stack([torch.where(inside, pos[:, :, :, :, 0], _OUTSIDE - base_y),
                         torch.where(inside, pos[:, :, :, :, 1], _OUTSIDE - base_x)], 4)
    return moved.view(offset.shape).to(offset.dtype), mask


def _write_read_part(buffer: Tensor, grad: Tensor) -> None:
    """Write ``grad`` (the gradient of the values the kernel read) into the first values of
    each sample of ``buffer``, as the kernels do; the rest keeps what it holds."""
    buffer.view(len(buffer), -1)[:, :grad[0].numel()].copy_(grad.reshape(len(grad), -1))


def _deform_conv2d_operands(input: Tensor, *tensors: Tensor | None) -> list[Tensor | None]:
    """The tensors in the dtype torchvision's kernels compute in: its CPU kernels have no
    bfloat16, so bfloat16 on the CPU computes in float32 (the callers' buffers round the
    results back)."""
    if input.dtype != torch.bfloat16 or input.device.type != 'cpu':
        return [input, *tensors]
    return [None if t is None else t.float() for t in (input, *tensors)]


def _deform_conv2d(input: Tensor, weight: Tensor, offset: Tensor, mask: Tensor | None,
                   bias: Tensor | None, geometry: tuple[int, ...]) -> Tensor:
    """torchvision's deformable convolution; ``geometry`` is (stride h, w, padding h, w,
    dilation h, w, groups, deformable groups), the offsets read as by :func:`_kernel_offsets`."""
    input, weight, offset, mask, bias = _deform_conv2d_operands(input, weight, offset, mask,
                                                                bias)
    use_mask = mask is not None
    mask = mask if use_mask else input.new_zeros(input.shape[0], 1)
    bias = bias if bias is not None else weight.new_zeros(weight.shape[0])
    return torch.ops.torchvision.deform_conv2d(input, weight, offset, mask, bias, *geometry,
                                               use_mask)


def _deform_conv2d_backward(grad_output: Tensor, input: Tensor, weight: Tensor, offset: Tensor,
                            mask: Tensor | None, bias: Tensor | None,
                            geometry: tuple[int, ...]) -> tuple[Tensor, ...]:
    """torchvision's gradients of :func:`_deform_conv2d`: by input, weight, offset, mask and
    bias."""
    input, grad_output, weight, offset, mask, bias = _deform_conv2d_operands(
        input, grad_output, weight, offset, mask, bias)
    use_mask = mask is not None
    mask = mask if use_mask else input.new_zeros(input.shape[0], 1)
    bias = bias if bias is not None else weight.new_zeros(weight.shape[0])
    with _atomic_adds_allowed(input.device):
        return torch.ops.torchvision._deform_conv2d_backward(
            grad_output.contiguous(), input, weight, offset, mask, bias, *geometry, use_mask)


def _deform_conv_v1_inputs(input: Tensor, weight: Tensor, offset: Tensor, out_hw: tuple[int, int],
                           geometry: tuple[int, ...]) -> Tensor:
    """DCNv1's offsets as its kernel reads them (its shape checked, as the kernel does)."""
    return _kernel_offsets(input, offset, None, weight.shape[-2:], out_hw, geometry,
                           'deform_conv')[0]


# DCNv1's backward is two compiled calls (input then weight) and torchvision's backward gives
# every gradient at once: the first call keeps the weight's for the second, keyed by the
# tensors both are handed.
_pending_weight_grad: dict[tuple, Tensor] = {}


def _backward_key(*tensors: Tensor) -> tuple:
    return tuple((t.data_ptr(), t._version, tuple(t.shape)) for t in tensors)


@_kernel
def deform_conv_forward(input: Tensor, weight: Tensor, offset: Tensor, output: Tensor,
                        columns: Tensor, ones: Tensor, kW: int, kH: int, dW: int, dH: int,
                        padW: int, padH: int, dilationW: int, dilationH: int, group: int,
                        deformable_group: int, im2col_step: int) -> None:
    """Deformable convolution (DCNv1) into ``output``; the kernel size is the weight's and
    ``columns``, ``ones`` and ``im2col_step`` are the CUDA kernel's workspace."""
    geometry = (dH, dW, padH, padW, dilationH, dilationW, group, deformable_group)
    offset = _deform_conv_v1_inputs(input, weight, offset, output.shape[-2:], geometry)
    output.copy_(_deform_conv2d(input, weight, offset, None, None, geometry))


@_kernel
def deform_conv_backward_input(input: Tensor, offset: Tensor, gradOutput: Tensor,
                               gradInput: Tensor, gradOffset: Tensor, weight: Tensor,
                               columns: Tensor, kW: int, kH: int, dW: int, dH: int, padW: int,
                               padH: int, dilationW: int, dilationH: int, group: int,
                               deformable_group: int, im2col_step: int) -> None:
    """Adds the gradient by the input to ``gradInput``; writes the one by the offsets.  The
    weight's gradient, computed in the same call, is kept for
    :func:`deform_conv_backward_parameters`."""
    geometry = (dH, dW, padH, padW, dilationH, dilationW, group, deformable_group)
    read = _deform_conv_v1_inputs(input, weight, offset, gradOutput.shape[-2:], geometry)
    grad_input, grad_weight, grad_offset, _, _ = _deform_conv2d_backward(
        gradOutput, input, weight, read, None, None, geometry)
    gradInput.add_(grad_input)
    gradOffset.copy_(grad_offset)
    _pending_weight_grad.clear()
    _pending_weight_grad[_backward_key(input, offset, gradOutput)] = grad_weight


@_kernel
def deform_conv_backward_parameters(input: Tensor, offset: Tensor, gradOutput: Tensor,
                                    gradWeight: Tensor, columns: Tensor, ones: Tensor, kW: int,
                                    kH: int, dW: int, dH: int, padW: int, padH: int,
                                    dilationW: int, dilationH: int, group: int,
                                    deformable_group: int, scale: float,
                                    im2col_step: int) -> None:
    """Adds ``scale`` times the gradient by the weight to ``gradWeight``: the one
    :func:`deform_conv_backward_input` computed for the same tensors, or computed here."""
    grad_weight = _pending_weight_grad.pop(_backward_key(input, offset, gradOutput), None)
    if grad_weight is None:
        geometry = (dH, dW, padH, padW, dilationH, dilationW, group, deformable_group)
        weight = gradWeight.new_zeros(gradWeight.shape)  # the weight gradient does not use it
        read = _deform_conv_v1_inputs(input, weight, offset, gradOutput.shape[-2:], geometry)
        _, grad_weight, _, _, _ = _deform_conv2d_backward(
            gradOutput, input, weight, read, None, None, geometry)
    gradWeight.add_(grad_weight, alpha=scale)


@_kernel
def modulated_deform_conv_forward(input: Tensor, weight: Tensor, bias: Tensor, ones: Tensor,
                                  offset: Tensor, mask: Tensor, output: Tensor, columns: Tensor,
                                  kernel_h: int, kernel_w: int, stride_h: int, stride_w: int,
                                  pad_h: int, pad_w: int, dilation_h: int, dilation_w: int,
                                  group: int, deformable_group: int, with_bias: bool) -> None:
    """Modulated deformable convolution (DCNv2) into ``output``."""
    geometry = (stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group,
                deformable_group)
    offset, mask = _kernel_offsets(input, offset, mask, weight.shape[-2:], output.shape[-2:],
                                   geometry, 'modulated_deform_conv')
    output.copy_(_deform_conv2d(input, weight, offset, mask, bias if with_bias else None,
                                geometry))


@_kernel
def modulated_deform_conv_backward(input: Tensor, weight: Tensor, bias: Tensor, ones: Tensor,
                                   offset: Tensor, mask: Tensor, columns: Tensor,
                                   grad_input: Tensor, grad_weight: Tensor, grad_bias: Tensor,
                                   grad_offset: Tensor, grad_mask: Tensor, grad_output: Tensor,
                                   kernel_h: int, kernel_w: int, stride_h: int, stride_w: int,
                                   pad_h: int, pad_w: int, dilation_h: int, dilation_w: int,
                                   group: int, deformable_group: int, with_bias: bool) -> None:
    """Adds the gradients by input, weight and bias to their buffers; writes those by the
    offsets and the mask (into the values the forward read)."""
    geometry = (stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group,
                deformable_group)
    offset, mask = _kernel_offsets(input, offset, mask, weight.shape[-2:],
                                   grad_output.shape[-2:], geometry, 'modulated_deform_conv')
    grads = _deform_conv2d_backward(grad_output, input, weight, offset, mask,
                                    bias if with_bias else None, geometry)
    grad_input.add_(grads[0])
    grad_weight.add_(grads[1])
    _write_read_part(grad_offset, grads[2])
    _write_read_part(grad_mask, grads[3])
    if with_bias:
        grad_bias.add_(grads[4])


# --- masked convolution ---------------------------------------------------------------------

@_kernel
def masked_im2col_forward(im: Tensor, mask_h_idx: Tensor, mask_w_idx: Tensor, col: Tensor,
                          kernel_h: int, kernel_w: int, pad_h: int, pad_w: int) -> None:
    """The kernel_h x kernel_w patches of image 0 of ``im`` (zero beyond its edges) at the
    masked positions into ``col`` (channels * kernel_h * kernel_w, positions), channel first
    as mmcv's kernel orders them."""
    padded = F.pad(im[0], (pad_w, max(kernel_w - 1 - pad_w, 0),
                           pad_h, max(kernel_h - 1 - pad_h, 0)))
    rows = mask_h_idx[:, None] + torch.arange(kernel_h, device=im.device)   # padded rows
    cols = mask_w_idx[:, None] + torch.arange(kernel_w, device=im.device)
    patches = padded[:, rows[:, :, None], cols[:, None, :]]   # (C, positions, kh, kw)
    col.copy_(patches.permute(0, 2, 3, 1).reshape(col.shape))


@_kernel
def masked_col2im_forward(col: Tensor, mask_h_idx: Tensor, mask_w_idx: Tensor, im: Tensor,
                          height: int, width: int, channels: int) -> None:
    """Each column of ``col`` (channels, positions) into image 0 of ``im`` at its position."""
    im[0, :, mask_h_idx, mask_w_idx] = col


# --- PSANet's point-wise spatial attention masks ---------------------------------------------

_PSA_COLLECT = 0   # mmcv's psa_type codes: 0 collect, 1 distribute


def _psamask_rows(psa_type: int, h_feature: int, w_feature: int, h_mask: int, w_mask: int,
                  half_h_mask: int, half_w_mask: int,
                  device: torch.device) -> Iterator[tuple[int, Tensor, Tensor]]:
    """For each row ``i`` of the mask: where its entries (mask column j, feature position p)
    go in the (H * W) x (H * W) attention map, flat: at row q, column p (collect) or row p,
    column q (distribute), q being p moved by the mask offset (i, j); and which of them fall
    on the map.  One mask row at a time, so that the indices take a ``h_mask``-th of the
    output's size."""
    h = torch.arange(h_feature, device=device)[:, None]
    w = torch.arange(w_feature, device=device)
    j = torch.arange(w_mask, device=device)[:, None, None]
    x = w + j - half_w_mask                                         # (w_mask, 1, W)
    here = (h * w_feature + w).flatten()                            # (H * W,)
    size = h_feature * w_feature
    for i in range(h_mask):
        y = h + i - half_h_mask                                     # (H, 1)
        on_map = ((y >= 0) & (y < h_feature) & (x >= 0) & (x < w_feature)).flatten(1)
        moved = (y * w_feature + x).flatten(1)                      # (w_mask, H * W)
        flat = moved * size + here if psa_type == _PSA_COLLECT else here * size + moved
        yield i, flat[on_map], on_map


@_kernel
def psamask_forward(input: Tensor, output: Tensor, psa_type: int, num_: int, h_feature: int,
                    w_feature: int, h_mask: int, w_mask: int, half_h_mask: int,
                    half_w_mask: int) -> None:
    """PSANet's mask (N, h_mask * w_mask, H, W) laid into the attention map ``output``
    (N, H * W, H, W), collected or distributed; entries off the map are left as they are."""
    mask = input.reshape(num_, h_mask, w_mask, -1)
    flat_output = output.view(num_, -1)
    for i, flat, on_map in _psamask_rows(psa_type, h_feature, w_feature, h_mask, w_mask,
                                         half_h_mask, half_w_mask, input.device):
        flat_output[:, flat] = mask[:, i][:, on_map]


@_kernel
def psamask_backward(grad_output: Tensor, grad_input: Tensor, psa_type: int, num_: int,
                     h_feature: int, w_feature: int, h_mask: int, w_mask: int,
                     half_h_mask: int, half_w_mask: int) -> None:
    """The gradient by the mask: each mask entry's place in the attention map's gradient."""
    grad_mask = grad_input.view(num_, h_mask, w_mask, -1)
    flat_grad = grad_output.reshape(num_, -1)
    for i, flat, on_map in _psamask_rows(psa_type, h_feature, w_feature, h_mask, w_mask,
                                         half_h_mask, half_w_mask, grad_output.device):
        grad_mask[:, i][:, on_map] = flat_grad[:, flat]


def get_compiler_version() -> str:
    """What mmcv reports as the compiler of its ops: here, none."""
    return f'none ({BACKEND})'


def get_compiling_cuda_version() -> str:
    """What mmcv reports as the CUDA its ops were built with: torch's, which runs them."""
    return f'none ({BACKEND}; torch CUDA {torch.version.cuda or "not available"})'


IMPLEMENTED = frozenset(__all__) - {'MissingCompiledOpError', 'IMPLEMENTED'}


def _missing(name: str) -> Callable[..., NoReturn]:
    def missing_op(*args: Any, **kwargs: Any) -> NoReturn:
        raise MissingCompiledOpError(name)
    missing_op.__name__ = missing_op.__qualname__ = name
    return missing_op


def __getattr__(name: str) -> Callable[..., NoReturn]:
    """Any other op name exists (``mmcv.ops`` checks them at import) and raises when called.

    Dunder names are not ops: answering them would make this module look like something it
    is not to ``pickle``, ``inspect`` and import machinery.
    """
    if name.startswith('__') and name.endswith('__'):
        raise AttributeError(name)
    return _missing(name)
