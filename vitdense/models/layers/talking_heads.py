"""Talking-heads attention (CaiT §2) in one fused attention call.

Talking heads mix the attention logits across heads before the softmax (``Wl``, ``bl``) and
the weights after it (``Ww``, ``bw``). Both mixes are linear, so they fold into the operands
of ``F.scaled_dot_product_attention``:

- logits: ``Σ_g Wl[h,g] q_g·k_g = q̃_h·k̃`` with ``q̃_h = [Wl[h,1] q_1, …, Wl[h,H] q_H]`` and
  ``k̃ = [k_1, …, k_H]`` (heads × head width); ``bl`` is constant along a row and cancels in
  the softmax. Additive logit terms shared by the heads' keys (ViTDet's relative positions)
  are mixed on the query side only.
- weights: ``out_h = Σ_g Ww[h,g] P_g v_h + bw_h Σ_j v_h[j]``, and ``P_g [v_1, …, v_H]`` for
  every g is the same call with the values of all heads side by side; a small mix of its
  output follows.

Every head's query meets the same keys and values, so the call runs them as grouped-query
attention: no (B, heads, N, N) tensor exists, and the largest one is the folded queries,
B × heads × N × (heads · head width). The cost is heads × the attention FLOPs of the model's
width, in fused kernels; on a GPU the call is recomputed in backward rather than keeping its
heads-times-larger operands. Below :data:`MIN_FUSED_TOKENS` tokens one written-out map per head
is faster (``benchmarks/benchmark_attention.py``, docs/memory.md), and attention dropout on
the mixed weights has no fold: both take :func:`written_out_weights`.
"""
import contextlib
from typing import Iterator, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .recompute import recomputed_in_backward

#: token count from which the folded call is taken (below it the written-out maps are
#: small and a few large matmuls are faster; ``benchmarks/benchmark_attention.py``)
MIN_FUSED_TOKENS = 2048
#: a token count no input reaches: with it as the threshold, talking heads stay written out
NEVER = 1 << 62
#: device types on which the fold keeps its operands for backward rather than recomputing
#: them (host memory is plentiful; recomputing costs a third more of the call)
KEEP_FOLDED_ON = ('cpu',)
#: head widths the fused kernels take are multiples of this
WIDTH_MULTIPLE = 8

#: additive logit terms ``q_t·k_t``: query terms (..., Nq, r) and key terms (N, r)
LogitTerms = tuple[torch.Tensor, torch.Tensor]


def use_fused(num_tokens: int, dropout: float) -> bool:
    """Whether talking heads take the folded call: without attention dropout, always under
    torch.compile and never under ``torch.export`` (a graph for every size never branches
    on its symbolic token count), else from :data:`MIN_FUSED_TOKENS` tokens."""
    if dropout or torch.compiler.is_exporting():
        return False
    return torch.compiler.is_compiling() or num_tokens >= MIN_FUSED_TOKENS


@contextlib.contextmanager
def fused_from(num_tokens: int) -> Iterator[None]:
    """Within: talking heads take the fold from ``num_tokens`` tokens (0: always;
    :data:`NEVER`: the written-out maps, whose products are the architecture's arithmetic,
    where the fold does heads × as many)."""
    global MIN_FUSED_TOKENS
    threshold, MIN_FUSED_TOKENS = MIN_FUSED_TOKENS, num_tokens
    try:
        yield
    finally:
        MIN_FUSED_TOKENS = threshold


def with_logit_terms(queries: torch.Tensor, keys: torch.Tensor,
                     terms: Optional[LogitTerms]) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries and keys whose dot products are ``queries·keys`` plus the logit terms: the
    terms as extra columns, zero-padded to a width the fused kernels take."""
    if terms is None:
        return queries, keys
    query_terms, key_terms = terms
    queries = torch.cat([queries, query_terms], dim=-1)
    keys = torch.cat([keys, key_terms.to(keys.dtype).expand(*keys.shape[:-1], -1)], dim=-1)
    pad = -queries.shape[-1] % WIDTH_MULTIPLE
    return F.pad(queries, (0, pad)), F.pad(keys, (0, pad))


def shared_key_attention(queries: torch.Tensor, keys: torch.Tensor,
                         values: torch.Tensor) -> torch.Tensor:
    """Attention (scale 1) of (B, heads, Nq, W) queries over (B, 1, N, W) keys and values
    shared by the heads; values narrower than W are zero-padded and cut back, as the fused
    kernels take one width. On CPU the call is grouped-query attention (its flash kernel
    reads the shared keys in place); elsewhere the keys are expanded, which every fused GPU
    kernel takes whatever the width (flash attention stops at 256)."""
    width = values.shape[-1]
    values = F.pad(values, (0, queries.shape[-1] - width))
    if queries.device.type == 'cpu':
        out = F.scaled_dot_product_attention(queries, keys, values, scale=1., enable_gqa=True)
    else:
        heads = queries.shape[1]
        out = F.scaled_dot_product_attention(queries, keys.expand(-1, heads, -1, -1),
                                             values.expand(-1, heads, -1, -1), scale=1.)
    return out[..., :width]


def _mixed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     logit_mix: torch.Tensor, weight_mix: torch.Tensor,
                     terms: Optional[LogitTerms]) -> torch.Tensor:
    """``Σ_g Ww[h,g] P_g v_h`` with ``P_g`` the softmax of the mixed logits, by one fused
    call over the folded queries, keys and values."""
    batch, heads, num_keys, dims = k.shape
    logit_mix = logit_mix.to(q.dtype)
    queries = torch.einsum('hg,bgnd->bhngd', logit_mix * scale, q).flatten(-2)
    keys = k.transpose(1, 2).reshape(batch, 1, num_keys, heads * dims)
    if terms is not None:
        terms = (torch.einsum('hg,bgnr->bhnr', logit_mix, terms[0].to(q.dtype)), terms[1])
    queries, keys = with_logit_terms(queries, keys, terms)
    values = v.transpose(1, 2).reshape(batch, 1, num_keys, heads * dims)
    # per weight head g and value head h: P_g v_h, (B, g, Nq, h, d)
    weighted = shared_key_attention(queries, keys, values).unflatten(-1, (heads, dims))
    return torch.einsum('hg,bgnhd->bhnd', weight_mix.to(v.dtype), weighted)


def talking_heads_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                            mix_logits: nn.Linear, mix_weights: nn.Linear,
                            terms: Optional[LogitTerms] = None) -> torch.Tensor:
    """Talking-heads attention of (B, heads, Nq, d) queries over (B, heads, N, d) keys and
    values, with logits ``scale·q·k`` plus ``terms``; output (B, heads, Nq, d).

    The fused call's folded operands and output are heads × larger than q, k and v: kept
    for backward they would nearly double a CaiT detector's activations. On devices not in
    :data:`KEEP_FOLDED_ON` (GPUs, whose memory is the limit) the call is recomputed in
    backward from q, k, v and the terms instead, one more forward of it."""
    args = (q, k, v, scale, mix_logits.weight, mix_weights.weight, terms)
    if q.device.type in KEEP_FOLDED_ON:
        out = _mixed_attention(*args)
    else:
        out = recomputed_in_backward(_mixed_attention, *args)
    out = out + mix_weights.bias.to(v.dtype).view(-1, 1, 1) * v.sum(-2, keepdim=True)
    # the logit mix's bias cancels in the softmax: its gradient is exactly zero, given
    # explicitly so that it stays a parameter that takes part (as DDP wants)
    return out + 0 * mix_logits.bias.sum().to(out.dtype)


def mix_heads(maps: torch.Tensor, mix: nn.Linear) -> torch.Tensor:
    """``mix`` across the heads of (B, heads, ...) maps, as one batched matmul on the
    head-major layout: every map stays contiguous."""
    batch, heads = maps.shape[:2]
    flat = maps.reshape(batch, heads, -1)
    mixed = torch.baddbmm(mix.bias.to(flat.dtype).view(1, heads, 1),
                          mix.weight.to(flat.dtype).expand(batch, -1, -1), flat)
    return mixed.view(maps.shape)


def written_out_weights(queries: torch.Tensor, keys: torch.Tensor, mix_logits: nn.Linear,
                        mix_weights: nn.Linear) -> torch.Tensor:
    """(B, heads, Nq, N) talking-heads weights as maps: logits ``queries·keys`` mixed across
    heads, softmax, mixed again (CaiT §2); the readable form of the folded call."""
    logits = queries @ keys.transpose(-2, -1)
    return mix_heads(mix_heads(logits, mix_logits).softmax(dim=-1), mix_weights)
