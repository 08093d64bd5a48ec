"""Token mixers of the four families. Each takes tokens (..., N, C) and the token grid
``hw`` (rows, cols) of the patch tokens, which some of them need (GPSA) and others ignore.

Token attention runs through ``F.scaled_dot_product_attention`` wherever the operation is
the same (plain and class attention, the content term of GPSA); talking heads mix attention
logits across heads, which the fused kernel cannot express. XCA's attention map is only
d×d per head, so it is written out in a layout that needs no copies besides one of qkv.
"""
import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .blockwise_attention import (mix_heads, positional_attention_values, positional_logits,
                                  relative_offsets, talking_heads_attention, use_blockwise)
from .branched import make_linear

Grid = tuple[int, int]
NORMALIZE_EPS = 1e-12  # F.normalize's default


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
        #: logit bias from the queries and the grid (ViTDet's relative positions), or None
        self.rel_pos: Optional[nn.Module] = None

    def forward(self, x: torch.Tensor, hw: Optional[Grid] = None,
                num_queries: Optional[int] = None) -> torch.Tensor:
        """Attention of every token, or of the first ``num_queries`` tokens only (all
        tokens still serve as keys and values); output (..., queries, C)."""
        # branches are folded into the batch: SDPA's fused kernels take 4-D inputs only
        q, k, v = _split_heads(self.qkv(x).flatten(0, -3), 3, self.num_heads)
        if num_queries is not None:
            q = q[..., :num_queries, :]
        q, k, scale = _with_relative_positions(self.rel_pos, q, k, self.scale, hw)
        drop = self.attn_drop if self.training else 0.
        if self.talking_heads and not drop and use_blockwise(k.shape[-2], q, k, v):
            out = talking_heads_attention(q, k, v, self.mix_logits, self.mix_weights, scale)
        elif self.talking_heads:
            out = F.dropout(self._written_out_weights(q, k, scale), drop, self.training) @ v
        else:
            out = _fused_attention(q, k, v, scale, drop)
        return self.proj_drop(self.proj(_merge_heads(out).view(*x.shape[:-2], -1, x.shape[-1])))

    def attention_weights(self, x: torch.Tensor, hw: Optional[Grid] = None) -> torch.Tensor:
        """(B, heads, N, N): the weights the forward pass applies to the values of tokens x
        (talking heads: after the post-softmax head mixing, so rows need not sum to one).
        Parallel branches, x of shape (branches, B, N, C), are stacked along the head axis,
        branch-major."""
        q, k, _ = _split_heads(self.qkv(x).flatten(0, -3), 3, self.num_heads)
        weights = self._written_out_weights(
            *_with_relative_positions(self.rel_pos, q, k, self.scale, hw))
        if x.dim() == 4:
            weights = weights.view(x.shape[0], x.shape[1], *weights.shape[1:])
            weights = weights.transpose(0, 1).flatten(1, 2)
        return weights

    def _written_out_weights(self, q: torch.Tensor, k: torch.Tensor,
                             scale: float) -> torch.Tensor:
        """(..., heads, queries, N) attention weights as a map: the softmax of the logits
        ``q·k·scale``; with talking heads, the logits mixed across heads before the softmax
        and the weights after it (CaiT §2)."""
        logits = (q * scale) @ k.transpose(-2, -1)
        if not self.talking_heads:
            return logits.softmax(dim=-1)
        return _mix_heads(_mix_heads(logits, self.mix_logits).softmax(dim=-1), self.mix_weights)


def _with_relative_positions(rel_pos: Optional[nn.Module], q: torch.Tensor, k: torch.Tensor,
                             scale: float, hw: Optional[Grid]
                             ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Queries, keys and the scale of their logits, with the bias of ``rel_pos`` (ViTDet's
    relative positions) folded into the queries and keys if there is one."""
    if rel_pos is None:
        return q, k, scale
    return (*rel_pos(q, k, scale, hw), 1.)


def _fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     dropout_p: float = 0.) -> torch.Tensor:
    """``F.scaled_dot_product_attention``; values narrower than queries and keys (folded
    relative positions) are zero-padded to their width and the output cut back, since the
    fused CPU and flash kernels take one head width."""
    width = v.shape[-1]
    if q.shape[-1] != width:
        v = F.pad(v, (0, q.shape[-1] - width))
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)
    return out if out.shape[-1] == width else out[..., :width]


def _mix_heads(maps: torch.Tensor, mix: nn.Linear) -> torch.Tensor:
    """``mix`` across the heads of (B, heads, N, M) attention maps (talking heads), on the
    head-major layout: the softmax runs over contiguous rows, no (B, N, M, heads) copies."""
    return mix_heads(maps, mix.weight, mix.bias)


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

    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """(B, heads, 1, 1+N): the class token's weights over itself and the N patch tokens."""
        (q,) = _split_heads(self.q(x[:, :1]), 1, self.num_heads)
        k, _ = _split_heads(self.kv(x), 2, self.num_heads)
        return ((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1)


class CrossCovarianceAttention(nn.Module):
    """XCA (XCiT §3.1): attention over channels, from the cross-covariance of l2-normalised
    keys and queries scaled by a learned per-head temperature. Cost is linear in tokens.

    q, k and v are laid out as (heads, d, N) rows in one copy; the l2 norms over tokens
    divide the d×d map rather than q and k, and the result is copied back to (N, C) rows
    once, so the projection is a single matmul.
    """

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
        batch, num_tokens, dim = x.shape
        # channels play the role of tokens: (3, B, heads, d, N)
        qkv = self.qkv(x).view(batch, num_tokens, 3, self.num_heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 4, 1).contiguous()
        # F.normalize(q) · F.normalize(k): the same norms (clamped alike), applied to q kᵀ
        q_norm = q.norm(dim=-1, keepdim=True).clamp_min(NORMALIZE_EPS)
        k_norm = k.norm(dim=-1, keepdim=True).clamp_min(NORMALIZE_EPS)
        if torch.finfo(q.dtype).bits < 32:
            # half precision: q kᵀ sums over all tokens and overflows float16 at high
            # resolution, so normalise first (two copies), as the official code does
            attn = (q / q_norm) @ (k / k_norm).transpose(-2, -1)
        else:
            attn = (q @ k.transpose(-2, -1)) / (q_norm * k_norm.transpose(-2, -1))
        attn = attn * self.temperature
        attn = F.dropout(attn.softmax(dim=-1), self.attn_drop, self.training)
        out = (attn @ v).reshape(batch, dim, num_tokens).transpose(1, 2).contiguous()
        return self.proj_drop(self.proj(out))

    def attention_weights(self, x: torch.Tensor, hw: Optional[Grid] = None) -> torch.Tensor:
        """(B, heads, d, d) attention between the d channels of each head (XCiT Eq. 2):
        softmax of the temperature-scaled cosine similarity of the queries' and keys'
        channels over the tokens."""
        batch, num_tokens, _ = x.shape
        q, k, _ = self.qkv(x).view(batch, num_tokens, 3, self.num_heads, -1).permute(2, 0, 3, 4, 1)
        cosine = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        return (cosine * self.temperature).softmax(dim=-1)


def relative_positions(hw: Grid, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(N, N, 3) offsets (dx, dy, dx²+dy²) from query patch to key patch on a rows×cols grid."""
    return relative_offsets(hw, 0, hw[0] * hw[1], device, dtype)


class GatedPositionalSelfAttention(nn.Module):
    """GPSA (ConViT §3): a per-head gate mixes content attention with a positional attention
    computed from relative offsets; the convolutional init makes each head attend to one
    neighbour of a k×k kernel. Offsets are built for any rectangular grid.

    Both attentions are normalised, so their gated sum is applied to the values term by
    term: the content term then runs fused and no (B, heads, N, N) map is stored. The
    offsets are built from the grid at every call and nothing is stored on the module, so
    a forward changes no state (export with a dynamic grid); while training at high token
    counts the positional term runs over query blocks (``blockwise_attention``).
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = False,
                 proj_drop: float = 0., locality_strength: float = 1.) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qk = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.pos_proj = nn.Linear(3, num_heads)
        self.locality_strength = locality_strength
        self.gating = nn.Parameter(torch.ones(num_heads))
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        #: logit bias of the content term (ViTDet's relative positions), or None
        self.rel_pos: Optional[nn.Module] = None

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

    def positional_attention(self, hw: Grid) -> torch.Tensor:
        """(heads, N, N) positional attention, computed head-major so that the softmax
        runs over contiguous rows; it is the same for every image of a batch."""
        logits, _ = positional_logits(hw, 0, hw[0] * hw[1], self.pos_proj.weight,
                                      self.pos_proj.bias)
        return logits.softmax(dim=-1)

    def forward(self, x: torch.Tensor, hw: Grid) -> torch.Tensor:
        batch, num_tokens, _ = x.shape
        q, k = _split_heads(self.qk(x), 2, self.num_heads)
        values = self.v(x)
        (v,) = _split_heads(values, 1, self.num_heads)
        q, k, scale = _with_relative_positions(self.rel_pos, q, k, q.shape[-1] ** -0.5, hw)
        content = _fused_attention(q, k, v, scale)
        # one (heads, N, N) map for the whole batch: images become value columns
        columns = values.view(batch, num_tokens, self.num_heads, -1).permute(2, 1, 0, 3).reshape(
            self.num_heads, num_tokens, -1)
        if use_blockwise(num_tokens, columns, self.pos_proj.weight):
            positional = positional_attention_values(columns, self.pos_proj, hw)
        else:
            positional = self.positional_attention(hw).to(columns.dtype) @ columns
        positional = positional.view(self.num_heads, num_tokens, batch, -1).permute(2, 0, 1, 3)
        # under autocast the two terms are half precision and the gate a float32 parameter
        gate = torch.sigmoid(self.gating).view(-1, 1, 1).to(content.dtype)
        out = torch.lerp(content, positional.to(content.dtype), gate)
        return self.proj_drop(self.proj(_merge_heads(out)))

    def attention_weights(self, x: torch.Tensor, hw: Grid) -> torch.Tensor:
        """(B, heads, N, N) weights (ConViT Eq. 7): (1 - σ(λ)) content + σ(λ) positional
        attention, the map the forward pass applies term by term."""
        q, k = _split_heads(self.qk(x), 2, self.num_heads)
        q, k, scale = _with_relative_positions(self.rel_pos, q, k, q.shape[-1] ** -0.5, hw)
        content = ((q * scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        return torch.lerp(content, self.positional_attention(hw).expand_as(content),
                          torch.sigmoid(self.gating).view(-1, 1, 1))
