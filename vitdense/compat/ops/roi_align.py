"""RoIAlign, average- and max-pooled (``roi_align_forward`` / ``_backward``)."""
from __future__ import annotations

import torch
import torchvision  # noqa: F401  (registers torch.ops.torchvision)
from torch import Tensor

from vitdense.compat.ops.kernel import FLT_MAX, atomic_adds_allowed, kernel

__all__ = ['roi_align_backward', 'roi_align_forward']

# mmcv's pool_mode codes (``RoIAlignFunction``): 0 is max, 1 is avg.
_POOL_MAX = 0


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
    best = pixels.new_full((len(rois), channels, *bins_hw), -FLT_MAX)
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


@kernel
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


@kernel
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
    with atomic_adds_allowed(grad_output.device):
        grad = torch.ops.torchvision._roi_align_backward(
            grad_output.to(dtype), rois.to(dtype), float(spatial_scale), int(aligned_height),
            int(aligned_width), batch, channels, height, width, int(sampling_ratio),
            bool(aligned))
    grad_input.add_(grad)
