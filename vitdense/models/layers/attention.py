"""Token mixers of the four families. Each takes tokens (..., N, C) and the token grid
``hw`` (rows, cols) of the patch tokens, which some of them need (GPSA, relative positions)
and others ignore.

Token attention runs through ``F.scaled_dot_product_attention``: plain and class attention
and the content term of GPSA; talking heads run in an operator of their own on CPU and fold
into the operands of one such call on GPUs (:mod:`.talking_heads`). GPSA's positional
attention is separable along the grid's axes and never becomes an N × N map. XCA's
attention map is only d×d per head, so it is written out in a layout that needs no copies
besides one of qkv.

A mask (EoMT's masked attention) restricts each of the first M tokens to the tokens it may
see: its output is the one the mixer gives it on that part of the sequence alone. For token
attention this is the usual masked softmax; for XCA a covariance over those tokens only.
"""
import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .branched import make_linear
from .grid import Grid
from .recompute import recomputed_in_backward
from .relative_bias import RelativePositionBias
from .rotary import RotaryPositionEmbedding
from .talking_heads import (LogitTerms, check_path, talking_heads_attention,
                            with_logit_terms, written_out_weights)
from .window_attention import DecomposedRelativePosition

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


def _relative_position(dim: int, num_heads: int,
                       rel_pos_grid: Optional[Grid]) -> Optional[DecomposedRelativePosition]:
    """ViTDet's relative position bias for tables of ``rel_pos_grid``, or None."""
    if rel_pos_grid is None:
        return None
    return DecomposedRelativePosition(dim // num_heads, rel_pos_grid)


def _logit_terms(rel_pos: Optional[nn.Module], q: torch.Tensor,
                 hw: Optional[Grid]) -> Optional[LogitTerms]:
    """The logit terms of the relative position bias for queries ``q``, or None."""
    return None if rel_pos is None else rel_pos(q, hw)


def _fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     terms: Optional[LogitTerms] = None, dropout_p: float = 0.,
                     bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` of logits ``scale·q·k`` plus ``terms`` plus an
    additive ``bias`` (heads, queries, keys); values narrower than the queries and keys with
    the terms are zero-padded to their width and the output cut back, since the fused CPU
    and flash kernels take one head width. A boolean ``bias`` is a mask (True: attend)."""
    if bias is not None and bias.is_floating_point():
        bias = bias.to(q.dtype)
    if terms is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p,
                                              scale=scale)
    q, k = with_logit_terms(q * scale, k, terms)
    width = v.shape[-1]
    out = F.scaled_dot_product_attention(q, k, F.pad(v, (0, q.shape[-1] - width)),
                                         attn_mask=bias, dropout_p=dropout_p, scale=1.)
    return out[..., :width]


def check_attention_mask(attn_mask: torch.Tensor, batch: int, num_tokens: int) -> torch.Tensor:
    """``attn_mask`` if it is a boolean (B, M, N) mask of the first M <= N tokens, else a
    ``ValueError`` naming the shape expected."""
    if (attn_mask.dtype != torch.bool or attn_mask.dim() != 3 or
            attn_mask.shape[0] != batch or attn_mask.shape[2] != num_tokens or
            attn_mask.shape[1] > num_tokens):
        raise ValueError(f'attn_mask must be a boolean tensor of shape (B, M, N) = ({batch}, '
                         f'M <= {num_tokens}, {num_tokens}), rows for the first M tokens; '
                         f'got {attn_mask.dtype} {tuple(attn_mask.shape)}')
    return attn_mask


class MultiheadSelfAttention(nn.Module):
    """Multi-head self-attention (ViT), optionally with talking heads (CaiT, §2 of its paper).

    With ``num_branches > 1`` the input carries a leading branch dimension and every branch
    has its own projections (parallel blocks of "Three things", computed in one batch).
    ``rel_pos_grid``: add ViTDet's decomposed relative position bias, tables sized for this
    grid (resampled to others). ``talking_heads_path``: the implementation of talking heads
    every call takes, one of ``talking_heads.PATHS`` (None: chosen per call from the device
    and the token count, :func:`.talking_heads.choose_path`). ``qk_norm``: LayerNorm of each
    head's queries and keys before attention (timm's ``qk_norm``), with ``norm_eps``.
    ``rope``: rotary position embeddings applied to the queries and keys of the patches
    (after ``qk_norm``, as timm's EVA), built for the grid each call gets (a window's in
    window attention). ``rel_pos_bias``: BEiT's per-block relative position bias.
    """

    #: linear layers whose weights the forward reads directly (the talking-heads kernels),
    #: not through the layer: a wrapper around them (a peft adapter) would be bypassed
    weights_read_directly = ('mix_logits', 'mix_weights')

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True,
                 attn_drop: float = 0., proj_drop: float = 0., talking_heads: bool = False,
                 num_branches: int = 1, rel_pos_grid: Optional[Grid] = None,
                 talking_heads_path: Optional[str] = None, qk_norm: bool = False,
                 norm_eps: float = 1e-6, rope: Optional[RotaryPositionEmbedding] = None,
                 rel_pos_bias: Optional[RelativePositionBias] = None) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
        if talking_heads and num_branches > 1:
            raise ValueError('talking heads attention does not support parallel branches')
        if rel_pos_grid is not None and num_branches > 1:
            raise ValueError('relative positions do not support parallel branches')
        self.num_heads, self.num_branches = num_heads, num_branches
        self.scale = (dim // num_heads) ** -0.5
        self.attn_drop = attn_drop
        self.qkv = make_linear(dim, dim * 3, qkv_bias, num_branches)
        self.proj = make_linear(dim, dim, True, num_branches)
        self.proj_drop = nn.Dropout(proj_drop)
        if talking_heads:
            self.mix_logits = nn.Linear(num_heads, num_heads)
            self.mix_weights = nn.Linear(num_heads, num_heads)
        self.talking_heads = talking_heads
        self.talking_heads_path = check_path(talking_heads_path)
        self.rel_pos = _relative_position(dim, num_heads, rel_pos_grid)
        if (qk_norm or rope is not None) and (talking_heads or num_branches > 1):
            raise ValueError('qk_norm and rotary position embeddings do not support talking '
                             'heads or parallel branches')
        self.q_norm = nn.LayerNorm(dim // num_heads, eps=norm_eps) if qk_norm else None
        self.k_norm = nn.LayerNorm(dim // num_heads, eps=norm_eps) if qk_norm else None
        self.rope = rope
        if rel_pos_bias is not None and (talking_heads or num_branches > 1):
            raise ValueError('BEiT\'s relative position bias does not support talking heads or '
                             'parallel branches')
        self.relative_position_bias = rel_pos_bias

    def _queries_keys_values(self, x: torch.Tensor, hw: Optional[Grid]
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-head q, k, v of tokens x (branches folded into the batch), queries and keys
        normalised and rotated where the layer does so."""
        # branches are folded into the batch: SDPA's fused kernels take 4-D inputs only
        q, k, v = _split_heads(self.qkv(x).flatten(0, -3), 3, self.num_heads)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope is not None:
            q, k = self.rope(q, hw), self.rope(k, hw)
        return q, k, v

    def _bias(self, hw: Optional[Grid], num_tokens: int) -> Optional[torch.Tensor]:
        """BEiT's relative position bias (heads, tokens, tokens), or None."""
        if self.relative_position_bias is None:
            return None
        return self.relative_position_bias(hw, num_tokens)

    def forward(self, x: torch.Tensor, hw: Optional[Grid] = None,
                num_queries: Optional[int] = None,
                attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Attention of every token, or of the first ``num_queries`` tokens only (all
        tokens still serve as keys and values); output (..., queries, C). ``attn_mask``:
        boolean (B, M, N), M <= N, True where each of the first M tokens may attend to
        another (the others attend to all), the same for every head (EoMT's masked
        attention); every row needs a True."""
        q, k, v = self._queries_keys_values(x, hw)
        terms = _logit_terms(self.rel_pos, q, hw)
        bias = self._bias(hw, k.shape[-2])
        if attn_mask is not None:
            bias = self._masked(bias, attn_mask, q)
        if num_queries is not None:
            q = q[..., :num_queries, :]
            terms = None if terms is None else (terms[0][..., :num_queries, :], terms[1])
            bias = None if bias is None else bias[..., :num_queries, :]
        drop = self.attn_drop if self.training else 0.
        if self.talking_heads:
            # talking heads build no additive bias: ``bias`` is the mask or None
            out = talking_heads_attention(q, k, v, self.scale, self.mix_logits,
                                          self.mix_weights, terms, drop,
                                          self.talking_heads_path, mask=bias)
        else:
            out = _fused_attention(q, k, v, self.scale, terms, drop, bias)
        return self.proj_drop(self.proj(_merge_heads(out).view(*x.shape[:-2], -1, x.shape[-1])))

    def _masked(self, bias: Optional[torch.Tensor], attn_mask: torch.Tensor,
                q: torch.Tensor) -> torch.Tensor:
        """The additive ``bias`` with -inf where ``attn_mask`` is False, or the boolean
        (B, 1, N, N) mask itself, one per image for all heads (SDPA and talking heads' maps
        take it as is)."""
        num_tokens = q.shape[-2]
        attn_mask = check_attention_mask(attn_mask, q.shape[0] // self.num_branches, num_tokens)
        free = attn_mask.new_ones(attn_mask.shape[0], num_tokens - attn_mask.shape[1],
                                  num_tokens)
        # parallel branches are folded into the batch branch-major
        mask = torch.cat([attn_mask, free], dim=1).repeat(self.num_branches, 1, 1)[:, None]
        if bias is None:
            return mask
        return bias.to(q.dtype).masked_fill(~mask, float('-inf'))

    def attention_weights(self, x: torch.Tensor, hw: Optional[Grid] = None) -> torch.Tensor:
        """(B, heads, N, N): the weights the forward pass applies to the values of tokens x
        (talking heads: after the post-softmax head mixing, so rows need not sum to one).
        Parallel branches, x of shape (branches, B, N, C), are stacked along the head axis,
        branch-major."""
        q, k, _ = self._queries_keys_values(x, hw)
        queries, keys = with_logit_terms(q * self.scale, k, _logit_terms(self.rel_pos, q, hw))
        if self.talking_heads:
            weights = written_out_weights(queries, keys, self.mix_logits, self.mix_weights)
        else:
            logits = queries @ keys.transpose(-2, -1)
            bias = self._bias(hw, k.shape[-2])
            weights = (logits if bias is None else logits + bias).softmax(dim=-1)
        if x.dim() == 4:
            weights = weights.view(x.shape[0], x.shape[1], *weights.shape[1:])
            weights = weights.transpose(0, 1).flatten(1, 2)
        return weights


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

    def forward(self, x: torch.Tensor, hw: Optional[Grid] = None,
                attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """XCA of tokens x (B, N, C). ``attn_mask`` (B, M, N) boolean: each of the first M
        tokens takes its covariance over the tokens its row marks
        (:func:`masked_cross_covariance`), the others over all."""
        batch, num_tokens, dim = x.shape
        # channels play the role of tokens: (3, B, heads, d, N)
        qkv = self.qkv(x).view(batch, num_tokens, 3, self.num_heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 4, 1).contiguous()
        out = self._attend(q, k, v)
        if attn_mask is not None:
            rows = check_attention_mask(attn_mask, batch, num_tokens).shape[1]
            maps = masked_cross_covariance(q, k, attn_mask, self.temperature).to(v.dtype)
            maps = F.dropout(maps, self.attn_drop, self.training)
            # (B, heads, M, d, d) @ (B, heads, M, d, 1): each row's map on its own values
            restricted = (maps @ v[..., :rows].transpose(-2, -1)[..., None]).squeeze(-1)
            out = torch.cat([restricted.transpose(-2, -1), out[..., rows:]], dim=-1)
        out = out.reshape(batch, dim, num_tokens).transpose(1, 2).contiguous()
        return self.proj_drop(self.proj(out))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(B, heads, d, N): every token's values mixed by the heads' d×d maps from the
        covariance over all tokens."""
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
        return F.dropout(attn.softmax(dim=-1), self.attn_drop, self.training) @ v

    def attention_weights(self, x: torch.Tensor, hw: Optional[Grid] = None) -> torch.Tensor:
        """(B, heads, d, d) attention between the d channels of each head (XCiT Eq. 2):
        softmax of the temperature-scaled cosine similarity of the queries' and keys'
        channels over the tokens."""
        batch, num_tokens, _ = x.shape
        q, k, _ = self.qkv(x).view(batch, num_tokens, 3, self.num_heads, -1).permute(2, 0, 3, 4, 1)
        cosine = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        return (cosine * self.temperature).softmax(dim=-1)


def masked_cross_covariance(q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor,
                            temperature: torch.Tensor) -> torch.Tensor:
    """(B, heads, M, d, d) float32: XCA's maps for the first M tokens, each from the
    cross-covariance of the l2-normalised query and key channels over the tokens its row of
    ``attn_mask`` (B, M, N) marks: what XCA computes on those tokens alone. q, k:
    (B, heads, d, N). Every token's covariance is the outer product of its channels, summed
    by one matmul with the mask: M·N·C·d multiply-adds (a ViT block's attention: 2·N²·C).
    In float32, as the sums run over many tokens."""
    q, k, mask = q.float(), k.float(), attn_mask.float().transpose(1, 2)  # mask (B, N, M)
    batch, heads, width, num_tokens = q.shape
    outer = (q.unsqueeze(-2) * k.unsqueeze(-3)).view(batch, -1, num_tokens)
    covariance = (outer @ mask).view(batch, heads, width, width, -1).permute(0, 1, 4, 2, 3)
    # (B, heads, M, d): the norms of each channel over each row's tokens
    q_norm = (q.square() @ mask[:, None]).sqrt().clamp_min(NORMALIZE_EPS).transpose(-2, -1)
    k_norm = (k.square() @ mask[:, None]).sqrt().clamp_min(NORMALIZE_EPS).transpose(-2, -1)
    cosine = covariance / (q_norm[..., :, None] * k_norm[..., None, :])
    return (cosine * temperature.float()[:, None]).softmax(dim=-1)


def patch_offsets(hw: Grid, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(N, N, 3) offsets (dx, dy, dx²+dy²) from query patch to key patch on a rows×cols
    grid, in row-major token order: GPSA's positional features, written out."""
    rows, cols = hw
    row, col = torch.meshgrid(torch.arange(rows, device=device),
                              torch.arange(cols, device=device), indexing='ij')
    row, col = row.flatten(), col.flatten()
    dx = (col[None, :] - col[:, None]).to(dtype)
    dy = (row[None, :] - row[:, None]).to(dtype)
    return torch.stack([dx, dy, dx ** 2 + dy ** 2], dim=-1)


def _axis_attention(length: int, linear: torch.Tensor, square: torch.Tensor,
                    bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(heads, length, length) softmax over keys of ``linear·δ + square·δ² (+ bias)``, δ the
    key's coordinate minus the query's along one axis; in float32."""
    coords = torch.arange(length, device=linear.device, dtype=torch.float32)
    delta = coords[None, :] - coords[:, None]
    logits = linear.float().view(-1, 1, 1) * delta + square.float().view(-1, 1, 1) * delta ** 2
    if bias is not None:
        logits = logits + bias.float().view(-1, 1, 1)
    return logits.softmax(dim=-1)


class GatedPositionalSelfAttention(nn.Module):
    """GPSA (ConViT §3): a per-head gate mixes content attention with a positional attention
    computed from relative offsets; the convolutional init makes each head attend to one
    neighbour of a k×k kernel. Works on any rectangular grid.

    Both attentions are normalised, so their gated sum is applied to the values term by
    term: the content term runs fused. The positional logits
    ``w_x Δx + w_y Δy + w_r (Δx² + Δy²) + b`` are a sum of a term of the column offset and
    a term of the row offset, so their softmax over the grid is the product of a softmax
    over key columns and one over key rows: the positional term is a (cols × cols) map
    applied along the grid's rows, then a (rows × rows) map along its columns, exactly,
    with H·N·(rows + cols) work instead of H·N² and no N × N map; backward recomputes it
    from the values. Nothing is stored on the
    module, so a forward changes no state (export with a dynamic grid).
    ``rel_pos_grid``: ViTDet's relative position bias on the content term.
    """

    #: the positional logits read ``pos_proj``'s weight directly (see above): a wrapper
    #: around it (a peft adapter) would be bypassed
    weights_read_directly = ('pos_proj',)

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = False,
                 proj_drop: float = 0., locality_strength: float = 1.,
                 rel_pos_grid: Optional[Grid] = None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qk = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.pos_proj = nn.Linear(3, num_heads)
        self.locality_strength = locality_strength
        self.gating = nn.Parameter(torch.ones(num_heads))
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.rel_pos = _relative_position(dim, num_heads, rel_pos_grid)

    def convolutional_init(self) -> None:
        """Identity values and one kernel offset per head (ConViT §3, locality strength α):
        head ``h`` attends to the offset (col, row) = (h // k, h % k) - centre of a k×k
        kernel, as timm's ``local_init``."""
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
        """(heads, N, N) positional attention, written out from the offsets: the readable
        form of the separable forward; the same for every image of a batch."""
        offsets = patch_offsets(hw, self.pos_proj.weight.device, self.pos_proj.weight.dtype)
        return self.pos_proj(offsets).permute(2, 0, 1).softmax(dim=-1)

    def positional_values(self, v: torch.Tensor, hw: Grid) -> torch.Tensor:
        """Positional attention applied to (B, heads, N, d) values, axis by axis. The bias
        rides with the column term: constant along a row, it gets a zero gradient as in
        the written-out map, and stays a parameter that takes part (as DDP wants)."""
        (w_x, w_y, w_r), bias = self.pos_proj.weight.unbind(1), self.pos_proj.bias
        along_cols = _axis_attention(hw[1], w_x, w_r, bias).to(v.dtype)
        along_rows = _axis_attention(hw[0], w_y, w_r).to(v.dtype)
        grid = v.unflatten(-2, hw)  # (B, heads, rows, cols, d)
        mixed = torch.einsum('hqc,bhrcd->bhrqd', along_cols, grid)
        return torch.einsum('hpr,bhrqd->bhpqd', along_rows, mixed).flatten(2, 3)

    def forward(self, x: torch.Tensor, hw: Grid) -> torch.Tensor:
        q, k = _split_heads(self.qk(x), 2, self.num_heads)
        (v,) = _split_heads(self.v(x), 1, self.num_heads)
        content = _fused_attention(q, k, v, q.shape[-1] ** -0.5,
                                   _logit_terms(self.rel_pos, q, hw))
        # recomputed in backward (a few percent of the content term's work) rather than
        # keeping the value-sized intermediates of its two axis passes
        positional = recomputed_in_backward(self.positional_values, v, hw)
        # under autocast the two terms are half precision and the gate a float32 parameter
        gate = torch.sigmoid(self.gating).view(-1, 1, 1).to(content.dtype)
        out = torch.lerp(content, positional.to(content.dtype), gate)
        return self.proj_drop(self.proj(_merge_heads(out)))

    def attention_weights(self, x: torch.Tensor, hw: Grid) -> torch.Tensor:
        """(B, heads, N, N) weights (ConViT Eq. 7): (1 - σ(λ)) content + σ(λ) positional
        attention, the map the forward pass applies term by term."""
        q, k = _split_heads(self.qk(x), 2, self.num_heads)
        queries, keys = with_logit_terms(q * q.shape[-1] ** -0.5, k,
                                         _logit_terms(self.rel_pos, q, hw))
        content = (queries @ keys.transpose(-2, -1)).softmax(dim=-1)
        return torch.lerp(content, self.positional_attention(hw).expand_as(content),
                          torch.sigmoid(self.gating).view(-1, 1, 1))
