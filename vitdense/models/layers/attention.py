"""Token mixers of the four families. Each takes tokens (..., N, C) and the token grid
``hw`` (rows, cols) of the patch tokens, which some of them need (GPSA) and others ignore.

Token attention runs through ``F.scaled_dot_product_attention`` wherever the operation is
the same (plain, class and cross-covariance attention, the content term of GPSA); talking
heads mix attention logits across heads, which the fused kernel cannot express.
"""
import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .branched import make_linear

Grid = tuple[int, int]


def _split_heads(x: torch.Tensor, parts: int, num_heads: int) -> tuple[torch.Tensor, ...]:
    """(..., N, parts*C) -> ``parts`` tensors of shape (..., heads, N, C/heads)."""
    *lead, n, width = x.shape
    x = x.reshape(*lead, n, parts, num_heads, width // (parts * num_heads))
    return x.movedim(-3, 0).transpose(-3, -2).unbind(0)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(..., heads, N, d) -> (..., N, heads*d)."""
    x = x.transpose(-3, -2)
    return x.reshape(*x.shape[:-2], -1)


class MultiheadSelfAttention(nn.Module):
    """Multi-head self-attention (ViT), optionally with talking heads (CaiT, §2 of its paper).

    With ``num_branches > 1`` the input carries a leading branch dimension and every branch
    has its own projections (parallel blocks of "Three things", computed in one batch).
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True,
                 attn_drop: float = 0., proj_drop: float = 0., talking_heads: bool = False,
                 num_branches: int = 1) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
        if talking_heads and num_branches > 1:
            raise ValueError('talking heads attention does not support parallel branches')
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.attn_drop = attn_drop
        self.qkv = make_linear(dim, dim * 3, qkv_bias, num_branches)
        self.proj = make_linear(dim, dim, True, num_branches)
        self.proj_drop = nn.Dropout(proj_drop)
        if talking_heads:
            self.mix_logits = nn.Linear(num_heads, num_heads)
            self.mix_weights = nn.Linear(num_heads, num_heads)
        self.talking_heads = talking_heads

    def forward(self, x: torch.Tensor, hw: Optional[Grid] = None) -> torch.Tensor:
        q, k, v = _split_heads(self.qkv(x), 3, self.num_heads)
        drop = self.attn_drop if self.training else 0.
        if self.talking_heads:
            logits = (q * self.scale) @ k.transpose(-2, -1)
            logits = self.mix_logits(logits.permute(0, 2, 3, 1))
            weights = self.mix_weights(logits.softmax(dim=-2)).permute(0, 3, 1, 2)
            out = F.dropout(weights, drop, self.training) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=drop)
        return self.proj_drop(self.proj(_merge_heads(out)))


class ClassAttention(nn.Module):
    """Class attention (CaiT §3): only the class token queries; keys and values come from
    the class token and all patch tokens. Input (B, 1+N, C), output (B, 1, C)."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True,
                 attn_drop: float = 0., proj_drop: float = 0.) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.attn_drop = attn_drop
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (q,) = _split_heads(self.q(x[:, :1]), 1, self.num_heads)
        k, v = _split_heads(self.kv(x), 2, self.num_heads)
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attn_drop if self.training else 0.)
        return self.proj_drop(self.proj(_merge_heads(out)))


class CrossCovarianceAttention(nn.Module):
    """XCA (XCiT §3.1): attention over channels, from the cross-covariance of l2-normalised
    keys and queries scaled by a learned per-head temperature. Cost is linear in tokens."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True,
                 attn_drop: float = 0., proj_drop: float = 0.) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, hw: Optional[Grid] = None) -> torch.Tensor:
        # channels play the role of tokens: (B, heads, d, N)
        q, k, v = (t.transpose(-2, -1) for t in _split_heads(self.qkv(x), 3, self.num_heads))
        q = F.normalize(q, dim=-1) * self.temperature
        k = F.normalize(k, dim=-1)
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attn_drop if self.training else 0., scale=1.0)
        return self.proj_drop(self.proj(_merge_heads(out.transpose(-2, -1))))


def relative_positions(hw: Grid, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(N, N, 3) offsets (dx, dy, dx²+dy²) from query patch to key patch on a rows×cols grid."""
    rows, cols = hw
    ys, xs = torch.meshgrid(torch.arange(rows, device=device, dtype=dtype),
                            torch.arange(cols, device=device, dtype=dtype), indexing='ij')
    xs, ys = xs.flatten(), ys.flatten()
    dx = xs[None, :] - xs[:, None]
    dy = ys[None, :] - ys[:, None]
    return torch.stack([dx, dy, dx ** 2 + dy ** 2], dim=-1)


class GatedPositionalSelfAttention(nn.Module):
    """GPSA (ConViT §3): a per-head gate mixes content attention with a positional attention
    computed from relative offsets; the convolutional init makes each head attend to one
    neighbour of a k×k kernel. Offsets are built for any rectangular grid.

    Both attentions are normalised, so their gated sum is applied to the values term by
    term: the content term then runs fused and no (B, heads, N, N) map is stored.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = False,
                 proj_drop: float = 0., locality_strength: float = 1.) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.locality_strength = locality_strength
        self.qk = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.pos_proj = nn.Linear(3, num_heads)
        self.gating = nn.Parameter(torch.ones(num_heads))
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self._offsets: Optional[tuple[tuple, torch.Tensor]] = None

    def convolutional_init(self) -> None:
        """Identity values and one kernel offset per head (ConViT §3, locality strength α)."""
        kernel = int(math.sqrt(self.num_heads))
        center = (kernel - 1) / 2
        with torch.no_grad():
            self.v.weight.copy_(torch.eye(self.v.weight.shape[0]))
            weight = torch.zeros_like(self.pos_proj.weight)
            for row in range(kernel):
                for col in range(kernel):
                    head = row + kernel * col
                    weight[head] = torch.tensor([2 * (col - center), 2 * (row - center), -1.])
            self.pos_proj.weight.copy_(weight * self.locality_strength)

    def _relative_offsets(self, hw: Grid, like: torch.Tensor) -> torch.Tensor:
        key = (hw, like.device, like.dtype)
        if self._offsets is None or self._offsets[0] != key:
            self._offsets = (key, relative_positions(hw, like.device, like.dtype))
        return self._offsets[1]

    def forward(self, x: torch.Tensor, hw: Grid) -> torch.Tensor:
        q, k = _split_heads(self.qk(x), 2, self.num_heads)
        (v,) = _split_heads(self.v(x), 1, self.num_heads)
        offsets = self._relative_offsets(hw, x)
        positional = self.pos_proj(offsets).permute(2, 0, 1).softmax(dim=-1)  # (heads, N, N)
        gate = torch.sigmoid(self.gating).view(-1, 1, 1)
        content = F.scaled_dot_product_attention(q, k, v)
        out = (1. - gate) * content + gate * (positional @ v)
        return self.proj_drop(self.proj(_merge_heads(out)))
