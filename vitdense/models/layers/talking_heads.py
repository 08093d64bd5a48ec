"""Talking-heads attention (CaiT §2): a CPU operator, a fold into fused attention, or maps.

Talking heads mix the attention logits across heads before the softmax (``Wl``, ``bl``) and
the weights after it (``Ww``, ``bw``). Three paths compute them (:data:`PATHS`):

- ``'blocks'``, on CPU from 1,024 tokens: :func:`.talking_heads_cpu.talking_heads_cpu`, one
  operator that walks blocks of queries with every head's maps in cache; the architecture's
  own products.
- ``'fold'``, on GPUs from 2,048 tokens: both mixes fold into the operands of one
  ``F.scaled_dot_product_attention`` call, so they run in its fused kernels.

  - logits: ``Σ_g Wl[h,g] q_g·k_g = q̃_h·k̃`` with ``q̃_h = [Wl[h,1] q_1, …, Wl[h,H] q_H]``
    and ``k̃ = [k_1, …, k_H]`` (heads × head width). Additive logit terms shared by the
    heads' keys (ViTDet's relative positions) are mixed on the query side only.
  - weights: ``out_h = Σ_g Ww[h,g] P_g v_h``, and ``P_g [v_1, …, v_H]`` for every g is the
    same call with the values of all heads side by side; a small mix of its output follows.

  The largest tensor is the folded queries, B × heads × N × (heads · head width); the cost
  is heads × the attention FLOPs, and the call runs again in backward rather than keeping
  its heads-times-larger operands.
- ``'maps'``: one written-out map per head (:func:`written_out_weights`), the readable form;
  taken below those token counts (:data:`FUSED_PATHS`), with attention dropout on the mixed
  weights (which neither fused path has) and under ``torch.export``.

On every path ``bl`` is constant along a row and cancels in the softmax, and ``bw`` adds
``bw_h Σ_j v_h[j]``.
"""
import contextlib
from typing import Iterator, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .recompute import recomputed_in_backward
from .talking_heads_cpu import talking_heads_cpu

#: the ways talking heads are computed (see the module doc)
PATHS = ('blocks', 'fold', 'maps')
#: per device type, the fused path and the token count from which it replaces the maps
#: (``benchmarks/benchmark_attention.py crossover`` on a CPU; docs/memory.md)
FUSED_PATHS = {'cpu': ('blocks', 1024)}
#: every other device's (GPUs, and the meta device of the memory account): COCO-sized inputs
#: and ViTDet's global blocks folded, whose maps would not fit a GPU; ADE20k's crop and
#: ViTDet's windows written out (which is faster there is unmeasured on a GPU)
DEFAULT_FUSED_PATH = ('fold', 2048)
#: the path every call takes, where :func:`forced_path` set one
_forced: Optional[str] = None
#: head widths the fused kernels take are multiples of this
WIDTH_MULTIPLE = 8

#: additive logit terms ``q_t·k_t``: query terms (..., Nq, r) and key terms (N, r)
LogitTerms = tuple[torch.Tensor, torch.Tensor]


def choose_path(device: torch.device, num_tokens: int, dropout: float) -> str:
    """The path of :data:`PATHS` talking heads take: the maps with attention dropout and
    under ``torch.export``; else the forced one, if any; else the device's fused path
    (:data:`FUSED_PATHS`) from its token count and always under ``torch.compile`` (one
    graph for every size never branches on its token count), the maps below."""
    if dropout or torch.compiler.is_exporting():
        return 'maps'
    if _forced is not None:
        return _forced
    path, min_tokens = FUSED_PATHS.get(device.type, DEFAULT_FUSED_PATH)
    return path if torch.compiler.is_compiling() or num_tokens >= min_tokens else 'maps'


@contextlib.contextmanager
def forced_path(path: str) -> Iterator[None]:
    """Within: talking heads take ``path`` of :data:`PATHS` on every device (``'maps'``: the
    products are the architecture's arithmetic, where the fold does heads × as many)."""
    global _forced
    if path not in PATHS:
        raise ValueError(f'unknown talking-heads path {path!r}; expected one of {PATHS}')
    previous, _forced = _forced, path
    try:
        yield
    finally:
        _forced = previous


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
    shared by the heads, expanded to every head, which every fused GPU kernel takes whatever
    the width (flash attention stops at 256); values narrower than W are zero-padded and
    cut back, as the fused kernels take one width."""
    width, heads = values.shape[-1], queries.shape[1]
    values = F.pad(values, (0, queries.shape[-1] - width))
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
                            terms: Optional[LogitTerms] = None,
                            dropout: float = 0.) -> torch.Tensor:
    """Talking-heads attention of (B, heads, Nq, d) queries over (B, heads, N, d) keys and
    values, with logits ``scale·q·k`` plus ``terms`` and ``dropout`` on the mixed weights;
    output (B, heads, Nq, d), by the path :func:`choose_path` picks."""
    path = choose_path(q.device, k.shape[-2], dropout)
    if path == 'maps':
        weights = written_out_weights(*with_logit_terms(q * scale, k, terms), mix_logits,
                                      mix_weights)
        return (F.dropout(weights, dropout) if dropout else weights) @ v
    if path == 'blocks':
        # contiguous heads, as the operator reads them and as compiled graphs then save them
        queries, keys = with_logit_terms(q * scale, k, terms)
        out = talking_heads_cpu(queries.contiguous(), keys.contiguous(), v.contiguous(),
                                mix_logits.weight, mix_weights.weight)[0]
    else:
        out = recomputed_in_backward(_mixed_attention, q, k, v, scale, mix_logits.weight,
                                     mix_weights.weight, terms)
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
