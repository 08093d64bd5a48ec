"""What the first layers learned (ViT Fig. 7 left and centre): the principal components of
the patch-embedding filters and the cosine similarity of the position encodings, for every
family (learned tables of ViT / CaiT / ConViT, XCiT's Fourier features through their
projection)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from vitdense.models.layers.attention import Grid
from vitdense.models.layers.embed import (FourierPositionEncoding, LearnedPositionEmbedding,
                                          resample_position_table)


@torch.no_grad()
def position_encodings(model: nn.Module, hw: Optional[Grid] = None) -> tuple[torch.Tensor, Grid]:
    """(rows·cols, D) position vectors of the patch grid, and that grid.

    Learned tables give their patch rows (without the class token's), resampled to ``hw``
    when given; XCiT's Fourier encoding is evaluated on ``hw`` (default: the pretraining
    grid).
    """
    encoding = getattr(model, 'pos_embed', None)
    hw = tuple(hw or model.pretrain_grid)
    if isinstance(encoding, LearnedPositionEmbedding):
        table = encoding.weight
        if hw != encoding.grid:
            table = resample_position_table(table, encoding.grid, hw,
                                            encoding.num_prefix_tokens, encoding.antialias,
                                            encoding.offset)
        return table[0, encoding.num_prefix_tokens:].float(), hw
    if isinstance(encoding, FourierPositionEncoding):  # what it adds to zero tokens
        weight = encoding.token_projection.weight
        zeros = weight.new_zeros(1, hw[0] * hw[1], weight.shape[0])
        return encoding(zeros, hw)[0].float(), hw
    raise TypeError(f'{type(model).__name__} has no position encoding to analyse '
                    f'(pos_embed is {type(encoding).__name__})')


def position_similarity(vectors: torch.Tensor, hw: Grid) -> torch.Tensor:
    """(rows, cols, rows, cols) cosine similarity: tile [r, c] compares the encoding of patch
    (r, c) with every patch's (ViT Fig. 7 centre)."""
    if vectors.shape[0] != hw[0] * hw[1]:
        raise ValueError(f'{vectors.shape[0]} position vectors for a {hw[0]}x{hw[1]} grid')
    unit = F.normalize(vectors.float(), dim=-1)
    return (unit @ unit.t()).reshape(*hw, *hw)


def patch_embedding_filters(model: nn.Module) -> torch.Tensor:
    """(D, C, k, k) weights of the first convolution of the patch embedding: the whole
    patch projection of a linear stem; the first 3×3 (XCiT) or sub-patch (hMLP) layer of
    deeper stems."""
    for module in model.patch_embed.modules():
        if isinstance(module, nn.Conv2d):
            return module.weight.detach()
    raise TypeError(f'{type(model.patch_embed).__name__} has no convolution')


def filter_components(filters: torch.Tensor,
                      num_components: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Principal components of a bank of (D, C, k, k) filters (ViT Fig. 7 left).

    Returns (num_components, C, k, k) unit components, ordered by the variance they
    explain, and the fraction of the filters' variance each explains.
    """
    flat = filters.flatten(1).double()
    rank = min(flat.shape)
    if not 1 <= num_components <= rank:
        raise ValueError(f'num_components must be in [1, {rank}] for {tuple(filters.shape)} '
                         f'filters, got {num_components}')
    centred = flat - flat.mean(dim=0, keepdim=True)
    _, singular, directions = torch.linalg.svd(centred, full_matrices=False)
    variance = singular ** 2
    explained = variance / variance.sum().clamp_min(1e-30)
    components = directions[:num_components].reshape(num_components, *filters.shape[1:])
    return components.float(), explained[:num_components].float()
