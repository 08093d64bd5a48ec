"""Masked convolution's im2col and col2im at the masked positions."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from vitdense.compat.ops.kernel import kernel

__all__ = ['masked_col2im_forward', 'masked_im2col_forward']


@kernel
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


@kernel
def masked_col2im_forward(col: Tensor, mask_h_idx: Tensor, mask_w_idx: Tensor, im: Tensor,
                          height: int, width: int, channels: int) -> None:
    """Each column of ``col`` (channels, positions) into image 0 of ``im`` at its position."""
    im[0, :, mask_h_idx, mask_w_idx] = col
