"""Talking heads on CPU: one operator that walks blocks of queries.

For a block of queries, every head's logit map, both head mixes and the softmax stay within
this CPU's cache (:data:`BLOCK_ROWS`, :data:`BLOCK_ELEMENTS`), and the products are the
architecture's own: one ``q·k`` and one ``P·v`` per head, where the fold into one fused call
(:mod:`.talking_heads`) does heads × as many. Backward recomputes each block's maps from q,
k, v and each row's log-sum-exp, the only tensors kept. The loop is inside one registered
operator (``vitdense::talking_heads``): autograd, ``torch.compile`` and dispatch modes see
one call whatever the token count.
"""
from typing import Iterator, Optional

import torch
from torch import Tensor

from .talking_heads_autograd import register_talking_heads_autograd

#: query rows per block where one image's maps exceed :data:`BLOCK_ELEMENTS`: 48-64 were
#: the fastest on a 2-core server CPU for 4 and 8 heads at 4,200 tokens, 16 and 128 up to
#: 1.5× and 1.15× slower (``benchmarks/benchmark_attention.py block-rows``)
BLOCK_ROWS = 64
#: images whose (heads, N, N) maps together hold at most this many elements (4 MiB in
#: float32, within a server CPU's cache) form one block
BLOCK_ELEMENTS = 1 << 20


def _blocks(batch: int, heads: int, num_queries: int,
            num_keys: int) -> Iterator[tuple[slice, slice]]:
    """(images, query rows) of each block: whole images, several at a time, while one
    image's maps fit :data:`BLOCK_ELEMENTS`, else :data:`BLOCK_ROWS` rows of one image."""
    per_image = heads * num_queries * num_keys
    if per_image <= BLOCK_ELEMENTS:
        images = BLOCK_ELEMENTS // per_image
        for start in range(0, batch, images):
            yield slice(start, start + images), slice(None)
        return
    for image in range(batch):
        for start in range(0, num_queries, BLOCK_ROWS):
            yield slice(image, image + 1), slice(start, start + BLOCK_ROWS)


def _mix(mix: Tensor, maps: Tensor, out: Optional[Tensor] = None) -> Tensor:
    """``Σ_g mix[h,g] maps[:, g]`` of contiguous (images, heads, rows, keys) maps, as one
    batched product (into ``out``, a map of the same shape, if given)."""
    images, heads = maps.shape[:2]
    flat_out = None if out is None else out.view(images, heads, -1)
    return torch.bmm(mix.expand(images, -1, -1), maps.view(images, heads, -1),
                     out=flat_out).view(maps.shape)


def _working_dtype(dtype: torch.dtype) -> torch.dtype:
    """Maps and mixes are computed in float32 at least, autocast or not (half-precision
    softmax sums lose the small weights)."""
    return torch.promote_types(dtype, torch.float32)


@torch.library.custom_op('vitdense::talking_heads', mutates_args=(), device_types='cpu')
def talking_heads_cpu(queries: Tensor, keys: Tensor, values: Tensor, logit_mix: Tensor,
                      weight_mix: Tensor) -> tuple[Tensor, Tensor]:
    """Talking heads of (B, heads, Nq, w) queries (scaled, any logit terms as extra
    columns) over (B, heads, N, w) keys and (B, heads, N, d) values: ``Σ_g Ww[h,g] P_g v_h``,
    (B, heads, Nq, d) in the values' dtype, with ``P_g`` the softmax of the logits mixed by
    ``Wl``; and each row's log-sum-exp of the mixed logits, (B, heads, Nq, 1)."""
    work = _working_dtype(queries.dtype)
    # contiguous heads: a block's products read each head's rows in place
    q, k, v, logit_mix, weight_mix = (t.to(work).contiguous() for t in (
        queries, keys, values, logit_mix, weight_mix))
    batch, heads, num_queries, _ = q.shape
    out = v.new_empty(batch, heads, num_queries, v.shape[-1])
    log_sum_exp = q.new_empty(batch, heads, num_queries, 1)
    keys_t = k.transpose(-2, -1)
    with torch.autocast('cpu', enabled=False):
        _forward_blocks(q, keys_t, v, logit_mix, weight_mix, out, log_sum_exp)
    return out.to(values.dtype), log_sum_exp


def _forward_blocks(q: Tensor, keys_t: Tensor, v: Tensor, logit_mix: Tensor,
                    weight_mix: Tensor, out: Tensor, log_sum_exp: Tensor) -> None:
    """:func:`talking_heads_cpu` block by block, into ``out`` and ``log_sum_exp``."""
    batch, heads, num_queries, _ = q.shape
    for images, rows in _blocks(batch, heads, num_queries, keys_t.shape[-1]):
        weights = _mix(logit_mix, q[images, :, rows] @ keys_t[images])
        row_max = weights.amax(-1, keepdim=True)
        weights = weights.sub_(row_max).exp_()
        total = weights.sum(-1, keepdim=True)
        weights.div_(total)
        log_sum_exp[images, :, rows] = total.log_().add_(row_max)
        out[images, :, rows] = _mix(weight_mix, weights) @ v[images]


@torch.library.custom_op('vitdense::talking_heads_backward', mutates_args=(),
                         device_types='cpu')
def _talking_heads_cpu_backward(grad: Tensor, queries: Tensor, keys: Tensor, values: Tensor,
                                logit_mix: Tensor, weight_mix: Tensor,
                                log_sum_exp: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor,
                                                              Tensor]:
    """Gradients of :func:`talking_heads_cpu`'s output for its five inputs, each block's maps
    recomputed from the inputs and the rows' log-sum-exp."""
    work = log_sum_exp.dtype
    inputs = (queries, keys, values, logit_mix, weight_mix)
    with torch.autocast('cpu', enabled=False):
        grads = _backward_blocks(grad.to(work).contiguous(),
                                 *(t.to(work).contiguous() for t in inputs), log_sum_exp)
    return tuple(g.to(t.dtype) for g, t in zip(grads, inputs))


def _backward_blocks(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, logit_mix: Tensor,
                     weight_mix: Tensor, log_sum_exp: Tensor) -> tuple[Tensor, ...]:
    """:func:`_talking_heads_cpu_backward` block by block, in one dtype."""
    batch, heads, num_queries, _ = q.shape
    dq = torch.empty_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    d_logit_mix, d_weight_mix = torch.zeros_like(logit_mix), torch.zeros_like(weight_mix)
    keys_t, values_t = k.transpose(-2, -1), v.transpose(-2, -1)
    for images, rows in _blocks(batch, heads, num_queries, k.shape[-2]):
        q_block, grad_block = q[images, :, rows], grad[images, :, rows]
        logits = q_block @ keys_t[images]
        weights = _mix(logit_mix, logits).sub_(log_sum_exp[images, :, rows]).exp_()
        mixed = _mix(weight_mix, weights)
        dv[images] += mixed.transpose(-2, -1) @ grad_block
        d_mixed = grad_block @ values_t[images]
        flat = (weights.shape[0], heads, -1)
        d_weight_mix += torch.bmm(d_mixed.view(flat),
                                  weights.view(flat).transpose(1, 2)).sum(0)
        d_weights = _mix(weight_mix.t(), d_mixed, out=mixed)
        d_mixed_logits = d_weights.sub_((weights * d_weights).sum(-1, keepdim=True))
        d_mixed_logits.mul_(weights)
        d_logit_mix += torch.bmm(d_mixed_logits.view(flat),
                                 logits.view(flat).transpose(1, 2)).sum(0)
        d_logits = _mix(logit_mix.t(), d_mixed_logits, out=logits)
        dq[images, :, rows] = d_logits @ k[images]
        dk[images] += d_logits.transpose(-2, -1) @ q_block
    return dq, dk, dv, d_logit_mix, d_weight_mix


@talking_heads_cpu.register_fake
def _(queries: Tensor, keys: Tensor, values: Tensor, logit_mix: Tensor,
      weight_mix: Tensor) -> tuple[Tensor, Tensor]:
    rows = queries.shape[:-1]
    return (values.new_empty(*rows, values.shape[-1]),
            queries.new_empty(*rows, 1, dtype=_working_dtype(queries.dtype)))


register_talking_heads_autograd(talking_heads_cpu, _talking_heads_cpu_backward)
