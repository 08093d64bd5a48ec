"""Non-maximum suppression: greedy (``nms``), soft (``softnms``) and with the groups each kept
box suppressed (``nms_match``)."""
from __future__ import annotations

import numpy as np
import torch
import torchvision  # noqa: F401  (registers torch.ops.torchvision)
from torch import Tensor

from vitdense.compat.ops.kernel import kernel

__all__ = ['nms', 'nms_match', 'softnms']

# mmcv's soft-NMS methods (``soft_nms``): 0 naive, 1 linear, 2 gaussian
_SOFTNMS_NAIVE, _SOFTNMS_GAUSSIAN = 0, 2


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


@kernel
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


@kernel
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
