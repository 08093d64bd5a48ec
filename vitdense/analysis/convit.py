"""ConViT's gates (Fig. 6): how much each GPSA head attends by position rather than content."""
from __future__ import annotations

import torch
import torch.nn as nn

from vitdense.models.layers.attention import GatedPositionalSelfAttention


@torch.no_grad()
def gating_strengths(model: nn.Module) -> dict[int, torch.Tensor]:
    """Block index -> (heads,) σ(λ_h) of every GPSA block: 1 is purely positional attention,
    0 purely content (ConViT Eq. 7)."""
    gates = {index: torch.sigmoid(block.attn.gating.float())
             for index, block in enumerate(model.blocks)
             if isinstance(block.attn, GatedPositionalSelfAttention)}
    if not gates:
        raise TypeError(f'{type(model).__name__} has no gated positional self-attention '
                        f'(GPSA) blocks')
    return gates
