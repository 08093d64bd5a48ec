"""Talking-heads attention (CaiT §2): every implementation, and the one place that picks one.

Talking heads mix the attention logits across heads before the softmax (``Wl``, ``bl``) and
the weights after it (``Ww``, ``bw``). :data:`KERNELS` holds the implementations, all with
one signature (:data:`TalkingHeadsKernel`); :func:`choose_path` picks one per call:

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
- ``'triton'``, only where forced: :func:`.talking_heads_triton.talking_heads_triton`,
  Triton kernels laid out for the tensor cores (every head its own tile, FlashAttention-2's
  backward without atomics) with the architecture's products and no map in memory (CUDA
  tensors, or CPU tensors under Triton's interpreter); not timed on a GPU yet, so no
  default (docs/memory.md).
- ``'maps'``: one written-out map per head (:func:`written_out_weights`), the readable form;
  taken below those token counts (:data:`FUSED_PATHS`), with attention dropout on the mixed
  weights (which no fused path has) and under ``torch.export``; the only path that takes an
  attention mask (EoMT's masked attention): masked keys get -inf in the mixed logits and zero
  in the mixed weights, so ``bw`` does not reach them either.

Forcing a path is an option of the layer (``MultiheadSelfAttention(talking_heads_path=)``)
or, for every layer of a model for a while, :func:`forced_path`. On every path ``bl`` is
constant along a row and cancels in the softmax, and ``bw`` adds ``bw_h Σ_j v_h[j]``.
"""
import contextlib
import os
from typing import Callable, Iterator, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .recompute import recomputed_in_backward
from .talking_heads_cpu import talking_heads_cpu

#: per device type, the fused path and the token count from which it replaces the maps
#: (``benchmarks/benchmark_attention.py crossover`` on a CPU; docs/memory.md)
FUSED_PATHS = {'cpu': ('blocks', 1024)}
#: every other device's (GPUs, and the meta device of the memory account): COCO-sized inputs
#: and ViTDet's global blocks folded, ADE20k's crop and ViTDet's windows written out; the
#: faster path at both (H200, CaiT-S24 layer: 4,200 tokens fold 34.9 ms, maps 55.0 ms; 1,024
#: tokens maps 3.55 ms, fold 4.98 ms; docs/benchmarks.md)
DEFAULT_FUSED_PATH = ('fold', 2048)
#: head widths the fused kernels take are multiples of this
WIDTH_MULTIPLE = 8

#: additive logit terms ``q_t·k_t``: query terms (..., Nq, r) and key terms (N, r)
LogitTerms = tuple[torch.Tensor, torch.Tensor]
#: an implementation: (q, k, v, scale, logit mix, weight mix, logit terms, dropout on the
#: mixed weights) -> (B, heads, Nq, d) output, the mixes' biases included
TalkingHeadsKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, nn.Linear,
                               nn.Linear, Optional[LogitTerms], float], torch.Tensor]
#: what a fused implementation computes: (q, k, v, scale, Wl, Ww, logit terms) ->
#: ``Σ_g Ww[h,g] P_g v_h``, without the mixes' biases
MixedAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, torch.Tensor,
                           torch.Tensor, Optional[LogitTerms]], torch.Tensor]


def choose_path(device: torch.device, num_tokens: int, dropout: float,
                forced: Optional[str] = None) -> str:
    """The path of :data:`KERNELS` talking heads take: the maps with attention dropout and
    under ``torch.export``; else ``forced``, if given; else the device's fused path
    (:data:`FUSED_PATHS`) from its token count and always under ``torch.compile`` (one
    graph for every size never branches on its token count), the maps below."""
    if dropout or torch.compiler.is_exporting():
        return 'maps'
    if forced is not None:
        return forced
    path, min_tokens = FUSED_PATHS.get(device.type, DEFAULT_FUSED_PATH)
    return path if torch.compiler.is_compiling() or num_tokens >= min_tokens else 'maps'


def runs_on(path: str, device: torch.device) -> bool:
    """Whether ``path`` runs on tensors of ``device``: the CPU operator on CPU tensors, the
    Triton kernel on CUDA tensors or, with ``TRITON_INTERPRET=1`` set before Triton was
    imported, on CPU tensors; every path on the meta device (their fake kernels)."""
    if path == 'blocks':
        return device.type in ('cpu', 'meta')
    if path == 'triton':
        return device.type in ('cuda', 'meta') or (
            device.type == 'cpu' and os.environ.get('TRITON_INTERPRET') == '1')
    return True


def available_paths(device: torch.device) -> tuple[str, ...]:
    """The paths of :data:`KERNELS` that run on ``device`` (what a benchmark can time)."""
    return tuple(path for path in KERNELS if runs_on(path, device))


def check_path(path: Optional[str]) -> Optional[str]:
    """``path`` if it names one of :data:`KERNELS` (or is None: chosen per call)."""
    if path is not None and path not in KERNELS:
        raise ValueError(f'unknown talking-heads path {path!r}; expected one of '
                         f'{tuple(KERNELS)} or None (chosen per call)')
    return path


@contextlib.contextmanager
def forced_path(model: nn.Module, path: Optional[str]) -> Iterator[nn.Module]:
    """Within: every talking-heads layer of ``model`` takes ``path`` of :data:`KERNELS`
    (``'maps'``: the architecture's arithmetic, where the fold does heads × as many), as
    their ``talking_heads_path`` option would; restored on exit."""
    check_path(path)
    layers = [m for m in model.modules() if hasattr(m, 'talking_heads_path')]
    previous = [layer.talking_heads_path for layer in layers]
    for layer in layers:
        layer.talking_heads_path = path
    try:
        yield model
    finally:
        for layer, before in zip(layers, previous):
            layer.talking_heads_path = before


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


def _written_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                 mix_logits: nn.Linear, mix_weights: nn.Linear, terms: Optional[LogitTerms],
                 dropout: float, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The ``'maps'`` path: every head's weights written out, dropout on the mixed ones."""
    weights = written_out_weights(*with_logit_terms(q * scale, k, terms), mix_logits,
                                  mix_weights, mask)
    return (F.dropout(weights, dropout) if dropout else weights) @ v


def _cpu_operator(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                  logit_mix: torch.Tensor, weight_mix: torch.Tensor,
                  terms: Optional[LogitTerms]) -> torch.Tensor:
    """The ``'blocks'`` path: the logit terms as extra columns, heads contiguous (as the
    operator reads them and as compiled graphs then save them)."""
    queries, keys = with_logit_terms(q * scale, k, terms)
    return talking_heads_cpu(queries.contiguous(), keys.contiguous(), v.contiguous(),
                             logit_mix, weight_mix)[0]


def _folded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
            logit_mix: torch.Tensor, weight_mix: torch.Tensor,
            terms: Optional[LogitTerms]) -> torch.Tensor:
    """The ``'fold'`` path, run again in backward rather than keeping its operands."""
    return recomputed_in_backward(_mixed_attention, q, k, v, scale, logit_mix, weight_mix,
                                  terms)


def _triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
            logit_mix: torch.Tensor, weight_mix: torch.Tensor,
            terms: Optional[LogitTerms]) -> torch.Tensor:
    """The ``'triton'`` path, heads contiguous as for the CPU operator; Triton is imported
    on first use, so that its interpreter can be chosen (``TRITON_INTERPRET=1``) before."""
    from .talking_heads_triton import talking_heads_triton
    queries, keys = with_logit_terms(q * scale, k, terms)
    return talking_heads_triton(queries.contiguous(), keys.contiguous(), v.contiguous(),
                                logit_mix, weight_mix)[0]


def _fused(mixed_attention: MixedAttention) -> TalkingHeadsKernel:
    """A fused implementation with the mixes' biases: ``bw`` adds ``bw_h Σ_j v_h[j]``, and
    ``bl`` cancels in the softmax."""
    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
               mix_logits: nn.Linear, mix_weights: nn.Linear, terms: Optional[LogitTerms],
               dropout: float) -> torch.Tensor:
        if dropout:
            raise ValueError('fused talking heads have no attention dropout: take the '
                             "'maps' path (or let choose_path pick it)")
        out = mixed_attention(q, k, v, scale, mix_logits.weight, mix_weights.weight, terms)
        out = out + mix_weights.bias.to(v.dtype).view(-1, 1, 1) * v.sum(-2, keepdim=True)
        # the logit mix's bias gets exactly zero gradient, given explicitly so that it
        # stays a parameter that takes part (as DDP wants)
        return out + 0 * mix_logits.bias.sum().to(out.dtype)
    return kernel


#: every implementation of talking heads, by path name (see the module doc)
KERNELS: dict[str, TalkingHeadsKernel] = {
    'blocks': _fused(_cpu_operator), 'fold': _fused(_folded), 'triton': _fused(_triton),
    'maps': _written_out}
#: the names of :data:`KERNELS`
PATHS = tuple(KERNELS)


def talking_heads_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                            mix_logits: nn.Linear, mix_weights: nn.Linear,
                            terms: Optional[LogitTerms] = None, dropout: float = 0.,
                            path: Optional[str] = None,
                            mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Talking-heads attention of (B, heads, Nq, d) queries over (B, heads, N, d) keys and
    values, with logits ``scale·q·k`` plus ``terms`` and ``dropout`` on the mixed weights;
    output (B, heads, Nq, d), by the path :func:`choose_path` picks (``path``: forced).
    ``mask``: boolean, broadcastable to (B, heads, Nq, N), True where a query may attend;
    it takes the ``'maps'`` path."""
    if mask is not None:
        if path not in (None, 'maps'):
            raise ValueError(f"an attention mask takes the 'maps' talking-heads path, not the "
                             f"forced {path!r}: force 'maps' or none")
        return _written_out(q, k, v, scale, mix_logits, mix_weights, terms, dropout, mask)
    path = choose_path(q.device, k.shape[-2], dropout, path)
    if not runs_on(path, q.device):
        raise ValueError(f'talking-heads path {path!r} does not run on {q.device.type} '
                         f'tensors; paths that do: {available_paths(q.device)}')
    return KERNELS[path](q, k, v, scale, mix_logits, mix_weights, terms, dropout)


def mix_heads(maps: torch.Tensor, mix: nn.Linear) -> torch.Tensor:
    """``mix`` across the heads of (B, heads, ...) maps, as one batched matmul on the
    head-major layout: every map stays contiguous."""
    batch, heads = maps.shape[:2]
    flat = maps.reshape(batch, heads, -1)
    mixed = torch.baddbmm(mix.bias.to(flat.dtype).view(1, heads, 1),
                          mix.weight.to(flat.dtype).expand(batch, -1, -1), flat)
    return mixed.view(maps.shape)


def written_out_weights(queries: torch.Tensor, keys: torch.Tensor, mix_logits: nn.Linear,
                        mix_weights: nn.Linear,
                        mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(B, heads, Nq, N) talking-heads weights as maps: logits ``queries·keys`` mixed across
    heads, softmax, mixed again (CaiT §2); the readable form of the folded call. ``mask``
    (True: attend): -inf in the mixed logits, zero in the mixed weights."""
    logits = mix_heads(queries @ keys.transpose(-2, -1), mix_logits)
    if mask is None:
        return mix_heads(logits.softmax(dim=-1), mix_weights)
    weights = mix_heads(logits.masked_fill(~mask, float('-inf')).softmax(dim=-1), mix_weights)
    return weights.masked_fill(~mask, 0.)
