"""PSANet's point-wise spatial attention masks, collected or distributed."""
from __future__ import annotations

from typing import Iterator

import torch
from torch import Tensor

from vitdense.compat.ops.kernel import kernel

__all__ = ['psamask_backward', 'psamask_forward']

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


@kernel
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


@kernel
def psamask_backward(grad_output: Tensor, grad_input: Tensor, psa_type: int, num_: int,
                     h_feature: int, w_feature: int, h_mask: int, w_mask: int,
                     half_h_mask: int, half_w_mask: int) -> None:
    """The gradient by the mask: each mask entry's place in the attention map's gradient."""
    grad_mask = grad_input.view(num_, h_mask, w_mask, -1)
    flat_grad = grad_output.reshape(num_, -1)
    for i, flat, on_map in _psamask_rows(psa_type, h_feature, w_feature, h_mask, w_mask,
                                         half_h_mask, half_w_mask, grad_output.device):
        grad_mask[:, i][:, on_map] = flat_grad[:, flat]
