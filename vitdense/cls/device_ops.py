"""Batched image operations on uint8 ``(N, 3, H, W)`` RGB tensors, equal to mmpretrain's CPU ops.

Each function applies one of the training augmentations of the DeiT recipe to a batch whose
per-sample parameters are already drawn (``vitdense/cls/device_augment.py`` draws them). The
arithmetic follows the CPU implementation each op stands in for, including where it rounds and
where it truncates to uint8, so that a given draw gives the same image on the device as
mmpretrain's pipeline (within one grey level):

* the random-resized crop resizes as PIL does (bicubic, a = -0.5, antialiased);
* rotate, shear and translate emulate OpenCV's ``warpAffine``: destination coordinates in
  fixed point (1/32 pixel), the 4x4 bicubic kernel (a = -0.75) as 15-bit integer weights, the
  border filled with a constant;
* grey levels are OpenCV's 14-bit fixed-point ``BGR2GRAY``; the colour ops blend and truncate
  (brightness, contrast, sharpness) or round (colour) as mmcv's ``adjust_*`` do.
"""
from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

#: Fixed-point constants of OpenCV's warpAffine / remap (imgwarp.cpp).
_INTER_BITS = 5
_INTER_TAB_SIZE = 1 << _INTER_BITS
_AB_BITS = 10
_COEF_BITS = 15
#: OpenCV's BGR2GRAY weights for uint8 images (R, G, B order), in 1/2**14.
_GRAY_WEIGHTS_RGB = (4899, 9617, 1868)


def trunc_uint8(x: torch.Tensor) -> torch.Tensor:
    """Clip to [0, 255] and truncate, as numpy's ``astype(np.uint8)`` after ``np.clip``."""
    return x.clamp(0, 255).to(torch.uint8)


def round_uint8(x: torch.Tensor) -> torch.Tensor:
    """Round half to even and saturate, as OpenCV's ``saturate_cast<uchar>``."""
    return x.round().clamp(0, 255).to(torch.uint8)


def resized_crop(images: Sequence[torch.Tensor], boxes: np.ndarray, size: int) -> torch.Tensor:
    """Crop ``boxes`` (rows of top, left, height, width) and resize each crop to ``size``².

    Bicubic with antialiasing is PIL's resampling filter, which mmpretrain's
    ``RandomResizedCrop(backend='pillow', interpolation='bicubic')`` calls.
    """
    crops = []
    for image, (top, left, height, width) in zip(images, boxes.tolist()):
        crop = image[None, :, top:top + height, left:left + width].float()
        crops.append(F.interpolate(crop, size=(size, size), mode='bicubic', antialias=True,
                                   align_corners=False))
    return round_uint8(torch.cat(crops))


def hflip(x: torch.Tensor, flipped: torch.Tensor) -> torch.Tensor:
    """Mirror the samples where the boolean ``flipped`` (N,) is set."""
    return torch.where(flipped[:, None, None, None], x.flip(-1), x)


def gray(x: torch.Tensor) -> torch.Tensor:
    """OpenCV's fixed-point grey level of each pixel, (N, 1, H, W) int32."""
    weights = torch.tensor(_GRAY_WEIGHTS_RGB, dtype=torch.int32, device=x.device)
    return ((x.int() * weights[:, None, None]).sum(1, keepdim=True) + (1 << 13)) >> 14


def _blend(x: torch.Tensor, degenerate: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``x * factor + degenerate * (1 - factor)`` in float32, as ``cv2.addWeighted``."""
    factor = factor.float()[:, None, None, None]
    return x.float() * factor + degenerate.float() * (1 - factor)


def color(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Blend with the grey image, rounded (mmcv ``adjust_color`` on uint8)."""
    return round_uint8(_blend(x, gray(x), factor))


def brightness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Blend with black, truncated (mmcv ``adjust_brightness``)."""
    return trunc_uint8(_blend(x, torch.zeros_like(x), factor))


def contrast(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Blend with the mean grey level, rounded half to even, then truncated."""
    grey = gray(x)
    mean = (grey.sum(dim=(1, 2, 3)).double() / grey[0].numel()).round()
    return trunc_uint8(_blend(x, mean[:, None, None, None].expand_as(x), factor))


def sharpness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Blend with PIL's SMOOTH filter (OpenCV's ``filter2D``: reflect-101 border, rounded)."""
    kernel = torch.tensor([[1., 1., 1.], [1., 5., 1.], [1., 1., 1.]], device=x.device) / 13
    padded = F.pad(x.float(), (1, 1, 1, 1), mode='reflect')
    smooth = F.conv2d(padded, kernel.expand(3, 1, 3, 3), groups=3)
    return trunc_uint8(_blend(x, round_uint8(smooth), factor))


def invert(x: torch.Tensor) -> torch.Tensor:
    return 255 - x


def posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """Keep the ``bits`` (N,) high bits of every channel (0 bits: black)."""
    shift = (8 - bits.int())[:, None, None, None]
    return ((x.int() >> shift) << shift).to(torch.uint8)


def solarize(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Invert the values at or above ``threshold`` (N,)."""
    return torch.where(x < threshold[:, None, None, None], x, 255 - x)


def solarize_add(x: torch.Tensor, addend: torch.Tensor, threshold: float) -> torch.Tensor:
    """Add ``addend`` (N,) to the values below ``threshold``, saturated and truncated."""
    added = trunc_uint8(x.double() + addend.double()[:, None, None, None])
    return torch.where(x < threshold, added, x)


def _per_channel_lut(x: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """Map every value through its image's and channel's table ``lut`` (N, C, 256)."""
    n, c = x.shape[:2]
    return lut.gather(2, x.reshape(n, c, -1).long()).reshape(x.shape).to(torch.uint8)


def _histogram(x: torch.Tensor) -> torch.Tensor:
    """Per image and channel counts of every grey level, (N, C, 256) int64."""
    n, c = x.shape[:2]
    offsets = torch.arange(n * c, device=x.device)[:, None] * 256
    flat = (x.reshape(n * c, -1).long() + offsets).flatten()
    return torch.bincount(flat, minlength=n * c * 256).reshape(n, c, 256)


def auto_contrast(x: torch.Tensor) -> torch.Tensor:
    """Stretch each channel to [0, 255] (mmcv ``auto_contrast`` with no cut-off)."""
    n, c = x.shape[:2]
    flat = x.reshape(n, c, -1)
    low, high = flat.amin(-1).double(), flat.amax(-1).double()
    scale = 255.0 / (high - low).clamp(min=1)
    levels = torch.arange(256, dtype=torch.float64, device=x.device)
    lut = (levels * scale[..., None] + (-low * scale)[..., None]).clamp(0, 255)
    lut = torch.where((high > low)[..., None], lut.floor(), levels)
    return _per_channel_lut(x, lut.long())


def equalize(x: torch.Tensor) -> torch.Tensor:
    """Equalise each channel's histogram (mmcv ``imequalize``, PIL's algorithm)."""
    hist = _histogram(x)
    top = x.reshape(*x.shape[:2], -1).amax(-1).long()
    step = (hist.sum(-1) - hist.gather(2, top[..., None])[..., 0]) // 255
    lut = (hist.cumsum(-1) + (step // 2)[..., None]) // step.clamp(min=1)[..., None]
    lut = F.pad(lut[..., :-1], (1, 0)).clamp(max=255)
    levels = torch.arange(256, device=x.device).expand_as(lut)
    return _per_channel_lut(x, torch.where((step > 0)[..., None], lut, levels))


def rotation_matrix(angle: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """OpenCV's forward matrices (N, 2, 3) of mmcv ``imrotate``: clockwise ``angle`` degrees."""
    theta = torch.deg2rad(-angle.double())
    alpha, beta = torch.cos(theta), torch.sin(theta)
    cx, cy = (width - 1) * 0.5, (height - 1) * 0.5
    return torch.stack([torch.stack([alpha, beta, (1 - alpha) * cx - beta * cy], -1),
                        torch.stack([-beta, alpha, beta * cx + (1 - alpha) * cy], -1)], 1)


def shear_matrix(magnitude: torch.Tensor, horizontal: bool) -> torch.Tensor:
    """mmcv ``imshear``'s float32 matrices (N, 2, 3)."""
    matrix = torch.eye(2, 3, dtype=torch.float64).repeat(len(magnitude), 1, 1)
    matrix[:, 0 if horizontal else 1, 1 if horizontal else 0] = magnitude.float().double()
    return matrix


def translation_matrix(offset: torch.Tensor, horizontal: bool) -> torch.Tensor:
    """mmcv ``imtranslate``'s float32 matrices (N, 2, 3) for an ``offset`` in pixels."""
    matrix = torch.eye(2, 3, dtype=torch.float64).repeat(len(offset), 1, 1)
    matrix[:, 0 if horizontal else 1, 2] = offset.float().double()
    return matrix


def _invert_affine(m: torch.Tensor) -> torch.Tensor:
    """Destination-to-source matrices, inverted in float64 as ``warpAffine`` does."""
    det = m[:, 0, 0] * m[:, 1, 1] - m[:, 0, 1] * m[:, 1, 0]
    d = torch.where(det != 0, 1.0 / det, torch.zeros_like(det))
    a11, a22 = m[:, 1, 1] * d, m[:, 0, 0] * d
    a12, a21 = -m[:, 0, 1] * d, -m[:, 1, 0] * d
    b1 = -a11 * m[:, 0, 2] - a12 * m[:, 1, 2]
    b2 = -a21 * m[:, 0, 2] - a22 * m[:, 1, 2]
    return torch.stack([torch.stack([a11, a12, b1], -1), torch.stack([a21, a22, b2], -1)], 1)


@functools.lru_cache(maxsize=None)
def _cubic_table() -> np.ndarray:
    """OpenCV's 15-bit bicubic weights (1024, 16), indexed by y_frac * 32 + x_frac."""
    a = np.float32(-0.75)
    one = np.float32(1)
    weights_1d = []
    for i in range(_INTER_TAB_SIZE):
        t = np.float32(i / _INTER_TAB_SIZE)
        c0 = ((a * (t + one) - 5 * a) * (t + one) + 8 * a) * (t + one) - 4 * a
        c1 = ((a + 2) * t - (a + 3)) * t * t + one
        c2 = ((a + 2) * (one - t) - (a + 3)) * (one - t) * (one - t) + one
        weights_1d.append(np.array([c0, c1, c2, one - c0 - c1 - c2], dtype=np.float32))
    table = np.empty((_INTER_TAB_SIZE ** 2, 16), dtype=np.int64)
    for i, wy in enumerate(weights_1d):
        for j, wx in enumerate(weights_1d):
            w = np.rint((wy[:, None] * wx[None, :]) * (1 << _COEF_BITS)).astype(np.int64)
            w = w.flatten()
            diff = int(w.sum()) - (1 << _COEF_BITS)
            if diff:
                centre = [5, 6, 9, 10]  # OpenCV corrects the sum on the central 2x2 taps
                k = centre[int(np.argmax(w[centre]))] if diff < 0 else \
                    centre[int(np.argmin(w[centre]))]
                w[k] -= diff
            table[i * _INTER_TAB_SIZE + j] = w
    return table


def warp_affine(x: torch.Tensor, matrix: torch.Tensor, fill: Sequence[float]) -> torch.Tensor:
    """``cv2.warpAffine(img, matrix, (W, H), INTER_CUBIC, borderValue=fill)`` for each sample.

    ``matrix`` (N, 2, 3) maps source to destination, as passed to OpenCV; pixels read from
    outside the image take ``fill``.
    """
    n, c, h, w = x.shape
    inv = _invert_affine(matrix.double()).to(x.device)
    scale = 1 << _AB_BITS
    ys = torch.arange(h, dtype=torch.float64, device=x.device)
    xs = torch.arange(w, dtype=torch.float64, device=x.device)

    def fixed(row: int) -> torch.Tensor:
        """Source coordinate ``row`` of every pixel in 1/32 pixel as OpenCV rounds it, (N, H, W)."""
        base = torch.round((inv[:, row, 1, None] * ys + inv[:, row, 2, None]) * scale)
        delta = torch.round(inv[:, row, 0, None] * xs * scale)
        round_delta = scale // _INTER_TAB_SIZE // 2
        return (base.long()[:, :, None] + round_delta + delta.long()[:, None, :]) >> (
            _AB_BITS - _INTER_BITS)

    sx, sy = fixed(0), fixed(1)
    # Every tap outside the image reads ``fill``: a border of fill wide enough for the 4x4
    # kernel at the clamped corner positions (-4 and size + 4) replaces the bounds checks.
    fill_values = torch.tensor(fill, dtype=torch.uint8, device=x.device)[None, :, None, None]
    padded = fill_values.expand(n, c, h + 12, w + 12).clone()
    padded[..., 4:h + 4, 4:w + 4] = x
    pw = w + 12
    flat = padded.reshape(n, c, -1)
    x0 = ((sx >> _INTER_BITS) - 1).clamp(-4, w + 4) + 4
    y0 = ((sy >> _INTER_BITS) - 1).clamp(-4, h + 4) + 4
    base = (y0 * pw + x0).reshape(n, 1, -1).expand(n, c, -1)
    table = torch.from_numpy(_cubic_table()).to(device=x.device, dtype=torch.int32)
    fraction = (sy & (_INTER_TAB_SIZE - 1)) * _INTER_TAB_SIZE + (sx & (_INTER_TAB_SIZE - 1))
    weights = table[fraction.reshape(n, -1)].permute(0, 2, 1).contiguous()  # (N, 16, H*W)
    acc = torch.zeros(n, c, h * w, dtype=torch.int32, device=x.device)
    for i in range(4):
        for j in range(4):
            acc += flat.gather(2, base + (i * pw + j)) * weights[:, None, i * 4 + j]
    out = (acc + (1 << (_COEF_BITS - 1))) >> _COEF_BITS
    return out.clamp(0, 255).to(torch.uint8).reshape(n, c, h, w)


def erase(x: torch.Tensor, boxes: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Replace each box (N, 4: top, left, height, width; zero height: none) by ``noise``.

    ``noise`` (N, 3, H, W) uint8 holds the fill of every pixel; only the boxes are used.
    """
    rows = torch.arange(x.shape[-2], device=x.device)
    cols = torch.arange(x.shape[-1], device=x.device)
    top, left, height, width = boxes.to(x.device).unbind(1)
    in_rows = (rows >= top[:, None]) & (rows < (top + height)[:, None])
    in_cols = (cols >= left[:, None]) & (cols < (left + width)[:, None])
    inside = in_rows[:, None, :, None] & in_cols[:, None, None, :]
    return torch.where(inside, noise, x)

