"""Token attention of the four families, recorded during a forward pass, and what the papers
compute from it: per-query maps, class-attention maps (CaiT §3, XCiT §3.3), attention rollout
(Abnar & Zuidema, 2020), mean attention distance (ViT Appendix D.6) and ConViT's nonlocality
(ConViT Eq. 8).

The blocks fuse attention (SDPA) and never materialise the weights, so a forward pre-hook on
each attention module asks it for them (``attention_weights`` of the token mixers, from the
module's own input and parameters); the backbones stay untouched and the recorded weights
are those the forward pass applies.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from vitdense.models.layers.attention import (CrossCovarianceAttention,
                                              GatedPositionalSelfAttention, Grid,
                                              MultiheadSelfAttention)


@dataclass
class AttentionRecord:
    """What one forward pass attended to.

    Attributes:
        grid: (rows, cols) of the patch tokens.
        trunk: block index -> (B, heads, N, N) token attention (N counts the class token
            from the block it joins on); XCiT's channel attention (XCA) is not token
            attention and has no entry.
        class_attention: per class-attention block, (B, heads, 1 + rows·cols) weights of the
            class token (CaiT, XCiT in classification mode).
    """

    grid: Optional[Grid] = None
    trunk: dict[int, torch.Tensor] = field(default_factory=dict)
    class_attention: list[torch.Tensor] = field(default_factory=list)

    def num_prefix_tokens(self, block: int) -> int:
        """Tokens before the patches (the class token) at trunk block ``block``."""
        return self.trunk[block].shape[-1] - self.grid[0] * self.grid[1]


class AttentionRecorder:
    """Context manager recording the attention of a columnar backbone's forward passes.

    ``with AttentionRecorder(model) as record: model(images)`` fills ``record`` (an
    :class:`AttentionRecord`); the hooks are removed on exit. A second forward pass inside
    the same context overwrites the first.
    """

    def __init__(self, model: nn.Module) -> None:
        if not hasattr(model, 'blocks') or not hasattr(model, 'patch_embed'):
            raise TypeError(f'AttentionRecorder needs a vitdense columnar backbone, got '
                            f'{type(model).__name__}')
        self.model = model
        self.record = AttentionRecord()
        self._handles: list = []

    def __enter__(self) -> AttentionRecord:
        record = self.record

        def keep_grid(module, args, output):
            record.grid = tuple(output[1])
            record.class_attention.clear()

        self._handles.append(self.model.patch_embed.register_forward_hook(keep_grid))
        for index, block in enumerate(self.model.blocks):
            if isinstance(block.attn, (MultiheadSelfAttention, GatedPositionalSelfAttention)):
                self._handles.append(block.attn.register_forward_pre_hook(
                    self._trunk_hook(index), with_kwargs=True))
            elif not isinstance(block.attn, CrossCovarianceAttention):
                raise TypeError(f'block {index}: no attention weights for '
                                f'{type(block.attn).__name__}')
        for block in self.model.cls_blocks or ():
            self._handles.append(block.attn.register_forward_pre_hook(
                lambda module, args: record.class_attention.append(
                    module.attention_weights(args[0])[:, :, 0].detach())))
        return record

    def _trunk_hook(self, index: int):
        def hook(module, args, kwargs):
            x, hw = args[0], args[1] if len(args) > 1 else kwargs.get('hw')
            # all queries, also where the forward computes only the class token's
            self.record.trunk[index] = module.attention_weights(x, hw).detach()
        return hook

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


@torch.no_grad()
def record_attention(model: nn.Module, images: torch.Tensor) -> AttentionRecord:
    """Run ``model`` (in eval mode) on ``images`` and return the attention it computed."""
    model.eval()
    with AttentionRecorder(model) as record:
        model(images)
    return record


def patch_grid_maps(weights: torch.Tensor, hw: Grid) -> torch.Tensor:
    """The weights on the patch keys (the last rows·cols) of (..., keys) as (..., rows, cols)."""
    num_patches = hw[0] * hw[1]
    return weights[..., weights.shape[-1] - num_patches:].reshape(*weights.shape[:-1], *hw)


def query_attention_maps(weights: torch.Tensor, hw: Grid, query: int) -> torch.Tensor:
    """(B, heads, rows, cols): where token ``query`` of a (B, heads, N, N) map attends.

    ``query`` indexes the token sequence (0 is the class token where there is one)."""
    if not -weights.shape[-2] <= query < weights.shape[-2]:
        raise IndexError(f'query {query} out of range for {weights.shape[-2]} tokens')
    return patch_grid_maps(weights[..., query, :], hw)


def attention_rollout(weights: Sequence[torch.Tensor], residual: float = 0.5) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema, 2020): (B, N, N) flow from the tokens entering
    the first block to the tokens leaving the last one.

    Each layer's head-averaged weights ``A`` become ``(1 - residual) A + residual I`` (the
    residual path), rows renormalised, and the layers are multiplied in order. Tokens that
    join later (ConViT's class token) pass the earlier layers unchanged: they are leading
    identity rows there. Negative weights (talking heads mix after the softmax) are clipped
    at zero before renormalising.
    """
    if not weights:
        raise ValueError('attention_rollout needs the weights of at least one layer')
    num_tokens = weights[-1].shape[-1]
    rollout = None
    for layer in weights:
        mean = layer.mean(dim=1).clamp_min(0)
        missing = num_tokens - mean.shape[-1]
        if missing < 0:
            raise ValueError('attention_rollout: a layer has more tokens than the last one')
        eye = torch.eye(mean.shape[-1], dtype=mean.dtype, device=mean.device)
        mixed = (1 - residual) * mean + residual * eye
        step = torch.eye(num_tokens, dtype=mean.dtype, device=mean.device).repeat(
            mean.shape[0], 1, 1)
        step[:, missing:, missing:] = mixed / mixed.sum(dim=-1, keepdim=True)
        rollout = step if rollout is None else step @ rollout
    return rollout


def _patch_centres(hw: Grid, like: torch.Tensor) -> torch.Tensor:
    rows, cols = torch.meshgrid(torch.arange(hw[0], dtype=like.dtype, device=like.device),
                                torch.arange(hw[1], dtype=like.dtype, device=like.device),
                                indexing='ij')
    return torch.stack([rows.flatten(), cols.flatten()], dim=-1)


def mean_attention_distance(weights: torch.Tensor, hw: Grid,
                            patch_size: float = 1.) -> torch.Tensor:
    """(heads,) mean distance between a patch query and the patches it attends to.

    For each patch query, the distances to all patch keys (in pixels when ``patch_size``
    is the patch stride, in patches when 1) weighted by its attention, averaged over queries
    and images (ViT Fig. 7 right, Appendix D.6). Class-token rows and columns are left out
    and each query's weights renormalised over the patches, so attention parked on the class
    token does not count as distance zero.
    """
    num_patches = hw[0] * hw[1]
    patches = weights[..., -num_patches:, -num_patches:].float()
    patches = patches / patches.sum(dim=-1, keepdim=True).clamp_min(1e-12)
    centres = _patch_centres(hw, patches)
    distance = torch.cdist(centres, centres) * patch_size
    return (patches * distance).sum(dim=-1).mean(dim=(0, 2))


def nonlocality(weights: torch.Tensor, hw: Grid) -> float:
    """ConViT's nonlocality of a layer (Eq. 8): the mean attention distance in patches,
    averaged over heads."""
    return mean_attention_distance(weights, hw).mean().item()


def class_attention_maps(weights: torch.Tensor, hw: Grid) -> torch.Tensor:
    """(B, heads, rows, cols) class-attention maps from (B, heads, 1 + rows·cols) weights;
    the class token's weight on itself is dropped, so a map sums to 1 minus that weight."""
    return patch_grid_maps(weights, hw)


def upsample_maps(maps: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(..., rows, cols) maps bilinearly resized to ``size`` and scaled to [0, 1] each,
    ready to overlay on the image."""
    lead = maps.shape[:-2]
    flat = maps.reshape(-1, 1, *maps.shape[-2:]).float()
    up = F.interpolate(flat, size=size, mode='bilinear', align_corners=False)
    low = up.amin(dim=(-2, -1), keepdim=True)
    span = (up.amax(dim=(-2, -1), keepdim=True) - low).clamp_min(1e-12)
    return ((up - low) / span).reshape(*lead, *size)
