"""Talking heads in one Triton kernel: the architecture's products, no map in memory.

One program takes a block of query rows of one image, every head at once, as (heads, rows,
keys) tiles in registers. Per block of keys: every head's ``q·k``, mixed across heads
(``Wl``) and, in a first pass over the keys, the running maximum and sum of each row's
exponentials (bounded: rescaled to the running maximum, as flash attention does); in a
second pass the normalised weights, mixed again (``Ww``), times each output head's values.
Backward recomputes each tile from q, k, v and each row's log-sum-exp, the only tensors
kept: a first pass over the keys sums each row's ``P·dP``, a second one forms the
gradients, adding those of the keys, values and mixes into float32 buffers (atomics). Both
are registered operators (``vitdense::talking_heads_triton``), so autograd,
``torch.compile`` and the memory account see one call.

CUDA tensors run the compiled kernels; CPU tensors run them in Triton's interpreter when
``TRITON_INTERPRET=1`` was set before Triton was imported (how the tests check them). Block
sizes are autotuned per head count and widths (CaiT XXS to M: 4-16 heads of 48-64). Half
precision inputs are multiplied with float32 accumulation; the mixes, the softmax and its
statistics are float32, and the weights are rounded to the values' precision for ``P·v``
(as flash attention does).
"""
from typing import Callable, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

#: (query rows, key columns, warps) of a program; the pruning keeps a (heads, rows, keys)
#: float32 tile within :data:`MAX_TILE` elements
BLOCKS = ((16, 16, 4), (32, 16, 4), (32, 32, 4), (64, 32, 8), (64, 64, 8))
MAX_TILE = 16384
INTERPRETING = triton.knobs.runtime.interpret


def _configs() -> list[triton.Config]:
    """Autotuning candidates; the interpreter takes the smallest blocks only (each
    candidate would run in it), so that small test grids span several blocks."""
    blocks = BLOCKS[2:3] if INTERPRETING else BLOCKS
    return [triton.Config({'BLOCK_M': m, 'BLOCK_N': n}, num_warps=w) for m, n, w in blocks]


def _prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """The candidates whose tiles fit :data:`MAX_TILE` (the smallest one at least)."""
    heads = kwargs.get('HEADS_P', named_args.get('HEADS_P'))
    fitting = [c for c in configs
               if heads * c.kwargs['BLOCK_M'] * c.kwargs['BLOCK_N'] <= MAX_TILE]
    return fitting or configs[:1]


def _autotuned(reset: Optional[list[str]] = None) -> Callable:
    """Autotuning per head count and widths over :func:`_configs`; the buffers named in
    ``reset`` take atomic additions, so they are zeroed around the timed runs."""
    return triton.autotune(configs=_configs(), key=['HEADS', 'WIDTH_P', 'DIMS_P'],
                           prune_configs_by={'early_config_prune': _prune},
                           reset_to_zero=reset)


@triton.jit
def _load_heads(ptr, heads, rows, cols, num_rows, width, HEADS: tl.constexpr):
    """(heads, rows, cols) of one image's contiguous (HEADS, num_rows, width) tensor, zero
    outside it."""
    offsets = (heads[:, None, None] * num_rows + rows[None, :, None]) * width + \
        cols[None, None, :]
    mask = (heads[:, None, None] < HEADS) & (rows[None, :, None] < num_rows) & \
        (cols[None, None, :] < width)
    return tl.load(ptr + offsets, mask=mask, other=0.)


@triton.jit
def _add_heads(ptr, values, heads, rows, cols, num_rows, width, HEADS: tl.constexpr):
    """Atomically add (heads, rows, cols) ``values`` into a float32 tensor laid out as in
    :func:`_load_heads`."""
    offsets = (heads[:, None, None] * num_rows + rows[None, :, None]) * width + \
        cols[None, None, :]
    mask = (heads[:, None, None] < HEADS) & (rows[None, :, None] < num_rows) & \
        (cols[None, None, :] < width)
    tl.atomic_add(ptr + offsets, values, mask=mask)


@triton.jit
def _head(tiles, heads, g):
    """Head ``g``'s (rows, keys) tile of (heads, rows, keys) tiles."""
    return tl.sum(tl.where(heads[:, None, None] == g, tiles, 0.), axis=0)


@triton.jit
def _mix(mix_ptr, tiles, heads, HEADS: tl.constexpr, TRANSPOSED: tl.constexpr):
    """``Σ_g mix[h, g] tiles[g]`` for every head h (``TRANSPOSED``: ``mix[g, h]``), float32."""
    mixed = tl.zeros(tiles.shape, tl.float32)
    for g in tl.static_range(HEADS):
        if TRANSPOSED:
            column = tl.load(mix_ptr + g * HEADS + heads, mask=heads < HEADS, other=0.)
        else:
            column = tl.load(mix_ptr + heads * HEADS + g, mask=heads < HEADS, other=0.)
        mixed += column[:, None, None] * _head(tiles, heads, g)[None, :, :]
    return mixed


@triton.jit
def _mix_gradient(d_mixed, tiles, heads, HEADS: tl.constexpr):
    """(heads, heads) gradient of a mix ``Σ_g mix[h, g] tiles[g]`` whose output has the
    gradient ``d_mixed``: ``Σ d_mixed[h] ⊙ tiles[g]``."""
    gradient = tl.zeros([heads.shape[0], heads.shape[0]], tl.float32)
    for g in tl.static_range(HEADS):
        column = tl.sum(tl.sum(d_mixed * _head(tiles, heads, g)[None, :, :], axis=2), axis=1)
        gradient += tl.where(heads[None, :] == g, column[:, None], 0.)
    return gradient


@triton.jit
def _logits(q, k_ptr, wl_ptr, heads, keys, num_keys, width, HEADS: tl.constexpr,
            WIDTH_P: tl.constexpr, PRECISION: tl.constexpr):
    """A key block's keys, every head's logits ``q·k`` and the logits mixed by ``Wl``
    (minus infinity past the last key), (heads, rows, keys) each."""
    k = _load_heads(k_ptr, heads, keys, tl.arange(0, WIDTH_P), num_keys, width, HEADS)
    logits = tl.dot(q, tl.trans(k, 0, 2, 1), input_precision=PRECISION)
    mixed = _mix(wl_ptr, logits, heads, HEADS, False)
    return k, logits, tl.where(keys[None, None, :] < num_keys, mixed, float('-inf'))


@triton.jit
def _log_sum_exp(q, k_ptr, wl_ptr, heads, num_keys, width, HEADS: tl.constexpr,
                 WIDTH_P: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Each (head, row)'s log-sum-exp of the mixed logits, one pass over the keys with the
    sum kept relative to the running maximum."""
    row_max = tl.full([q.shape[0], q.shape[1]], float('-inf'), tl.float32)
    total = tl.zeros([q.shape[0], q.shape[1]], tl.float32)
    for start in range(0, num_keys, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        _, _, mixed = _logits(q, k_ptr, wl_ptr, heads, keys, num_keys, width, HEADS,
                              WIDTH_P, PRECISION)
        new_max = tl.maximum(row_max, tl.max(mixed, axis=2))
        total = total * tl.exp(row_max - new_max) + \
            tl.sum(tl.exp(mixed - new_max[:, :, None]), axis=2)
        row_max = new_max
    return row_max + tl.log(total)


@_autotuned()
@triton.jit
def _forward_kernel(q_ptr, k_ptr, v_ptr, wl_ptr, ww_ptr, out_ptr, lse_ptr, num_queries,
                    num_keys, width, dims, HEADS: tl.constexpr, HEADS_P: tl.constexpr,
                    WIDTH_P: tl.constexpr, DIMS_P: tl.constexpr, PRECISION: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Output and log-sum-exp of one block of query rows of one image."""
    image = tl.program_id(1)
    heads, rows = tl.arange(0, HEADS_P), tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    q_ptr += image * HEADS * num_queries * width
    k_ptr += image * HEADS * num_keys * width
    v_ptr += image * HEADS * num_keys * dims
    q = _load_heads(q_ptr, heads, rows, tl.arange(0, WIDTH_P), num_queries, width, HEADS)
    lse = _log_sum_exp(q, k_ptr, wl_ptr, heads, num_keys, width, HEADS, WIDTH_P, BLOCK_N,
                       PRECISION)
    out = tl.zeros([HEADS_P, BLOCK_M, DIMS_P], tl.float32)
    for start in range(0, num_keys, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        _, _, mixed = _logits(q, k_ptr, wl_ptr, heads, keys, num_keys, width, HEADS,
                              WIDTH_P, PRECISION)
        weights = _mix(ww_ptr, tl.exp(mixed - lse[:, :, None]), heads, HEADS, False)
        v = _load_heads(v_ptr, heads, keys, tl.arange(0, DIMS_P), num_keys, dims, HEADS)
        out += tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
    row_offsets = (image * HEADS + heads[:, None]) * num_queries + rows[None, :]
    row_mask = (heads[:, None] < HEADS) & (rows[None, :] < num_queries)
    tl.store(lse_ptr + row_offsets, lse, mask=row_mask)
    cols = tl.arange(0, DIMS_P)
    tl.store(out_ptr + row_offsets[:, :, None] * dims + cols[None, None, :],
             out.to(out_ptr.dtype.element_ty),
             mask=row_mask[:, :, None] & (cols[None, None, :] < dims))


@triton.jit
def _row_deltas(q, grad, lse, k_ptr, v_ptr, wl_ptr, ww_ptr, heads, num_keys, width, dims,
                HEADS: tl.constexpr, WIDTH_P: tl.constexpr, DIMS_P: tl.constexpr,
                BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Each (head, row)'s ``Σ_j P[j] dP[j]``, the softmax's backward term, over the keys:
    ``dP_g = Σ_h Ww[h, g] dO_h v_hᵀ``."""
    deltas = tl.zeros(lse.shape, tl.float32)
    for start in range(0, num_keys, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        _, _, mixed = _logits(q, k_ptr, wl_ptr, heads, keys, num_keys, width, HEADS,
                              WIDTH_P, PRECISION)
        v = _load_heads(v_ptr, heads, keys, tl.arange(0, DIMS_P), num_keys, dims, HEADS)
        d_mixed = tl.dot(grad, tl.trans(v, 0, 2, 1), input_precision=PRECISION)
        d_weights = _mix(ww_ptr, d_mixed, heads, HEADS, True)
        deltas += tl.sum(tl.exp(mixed - lse[:, :, None]) * d_weights, axis=2)
    return deltas


@_autotuned(reset=['dq_ptr', 'dk_ptr', 'dv_ptr', 'dwl_ptr', 'dww_ptr'])
@triton.jit
def _backward_kernel(grad_ptr, q_ptr, k_ptr, v_ptr, wl_ptr, ww_ptr, lse_ptr, dq_ptr, dk_ptr,
                     dv_ptr, dwl_ptr, dww_ptr, num_queries, num_keys, width, dims,
                     HEADS: tl.constexpr, HEADS_P: tl.constexpr, WIDTH_P: tl.constexpr,
                     DIMS_P: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    """Gradients from one block of query rows of one image, added into float32 buffers
    (those of the keys, values and mixes by every block of the image)."""
    image = tl.program_id(1)
    heads, rows = tl.arange(0, HEADS_P), tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    q_ptr += image * HEADS * num_queries * width
    dq_ptr += image * HEADS * num_queries * width
    grad_ptr += image * HEADS * num_queries * dims
    k_ptr += image * HEADS * num_keys * width
    dk_ptr += image * HEADS * num_keys * width
    v_ptr += image * HEADS * num_keys * dims
    dv_ptr += image * HEADS * num_keys * dims
    width_cols, dims_cols = tl.arange(0, WIDTH_P), tl.arange(0, DIMS_P)
    q = _load_heads(q_ptr, heads, rows, width_cols, num_queries, width, HEADS)
    grad = _load_heads(grad_ptr, heads, rows, dims_cols, num_queries, dims, HEADS)
    row_mask = (heads[:, None] < HEADS) & (rows[None, :] < num_queries)
    lse = tl.load(lse_ptr + (image * HEADS + heads[:, None]) * num_queries + rows[None, :],
                  mask=row_mask, other=0.)
    deltas = _row_deltas(q, grad, lse, k_ptr, v_ptr, wl_ptr, ww_ptr, heads, num_keys, width,
                         dims, HEADS, WIDTH_P, DIMS_P, BLOCK_N, PRECISION)
    dq = tl.zeros([HEADS_P, BLOCK_M, WIDTH_P], tl.float32)
    d_logit_mix = tl.zeros([HEADS_P, HEADS_P], tl.float32)
    d_weight_mix = tl.zeros([HEADS_P, HEADS_P], tl.float32)
    for start in range(0, num_keys, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        k, logits, mixed = _logits(q, k_ptr, wl_ptr, heads, keys, num_keys, width, HEADS,
                                   WIDTH_P, PRECISION)
        weights = tl.exp(mixed - lse[:, :, None])
        v = _load_heads(v_ptr, heads, keys, dims_cols, num_keys, dims, HEADS)
        mixed_weights = _mix(ww_ptr, weights, heads, HEADS, False).to(v.dtype)
        _add_heads(dv_ptr, tl.dot(tl.trans(mixed_weights, 0, 2, 1), grad,
                                  input_precision=PRECISION), heads, keys, dims_cols,
                   num_keys, dims, HEADS)
        d_mixed = tl.dot(grad, tl.trans(v, 0, 2, 1), input_precision=PRECISION)
        d_weight_mix += _mix_gradient(d_mixed, weights, heads, HEADS)
        d_logits = weights * (_mix(ww_ptr, d_mixed, heads, HEADS, True) - deltas[:, :, None])
        d_logit_mix += _mix_gradient(d_logits, logits, heads, HEADS)
        d_logits = _mix(wl_ptr, d_logits, heads, HEADS, True).to(q.dtype)
        dq += tl.dot(d_logits, k, input_precision=PRECISION)
        _add_heads(dk_ptr, tl.dot(tl.trans(d_logits, 0, 2, 1), q, input_precision=PRECISION),
                   heads, keys, width_cols, num_keys, width, HEADS)
    _add_heads(dq_ptr, dq, heads, rows, width_cols, num_queries, width, HEADS)
    mix_offsets = heads[:, None] * HEADS + heads[None, :]
    mix_mask = (heads[:, None] < HEADS) & (heads[None, :] < HEADS)
    tl.atomic_add(dwl_ptr + mix_offsets, d_logit_mix, mask=mix_mask)
    tl.atomic_add(dww_ptr + mix_offsets, d_weight_mix, mask=mix_mask)


def _sizes(queries: Tensor, values: Tensor) -> dict:
    """The kernels' compile-time sizes: heads (and their power of two), the queries' and
    values' widths as powers of two, and float32's products exact (no TF32)."""
    heads, width, dims = queries.shape[1], queries.shape[-1], values.shape[-1]
    return dict(HEADS=heads, HEADS_P=triton.next_power_of_2(heads),
                WIDTH_P=max(16, triton.next_power_of_2(width)),
                DIMS_P=max(16, triton.next_power_of_2(dims)),
                PRECISION='ieee' if queries.dtype == torch.float32 else 'tf32')


def _operands(*tensors: Tensor) -> tuple[Tensor, ...]:
    """Contiguous operands in one dtype (under autocast the logit terms' columns may be
    float32 beside half-precision queries)."""
    dtype = tensors[0].dtype
    for tensor in tensors[1:]:
        dtype = torch.promote_types(dtype, tensor.dtype)
    return tuple(t.to(dtype).contiguous() for t in tensors)


@torch.library.custom_op('vitdense::talking_heads_triton', mutates_args=(),
                         device_types=('cuda', 'cpu'))
def talking_heads_triton(queries: Tensor, keys: Tensor, values: Tensor, logit_mix: Tensor,
                         weight_mix: Tensor) -> tuple[Tensor, Tensor]:
    """Talking heads of (B, heads, Nq, w) queries (scaled, any logit terms as extra
    columns) over (B, heads, N, w) keys and (B, heads, N, d) values: ``Σ_g Ww[h,g] P_g v_h``,
    (B, heads, Nq, d) in the values' dtype, with ``P_g`` the softmax of the logits mixed by
    ``Wl``; and each row's log-sum-exp of the mixed logits, (B, heads, Nq) in float32."""
    q, k, v = _operands(queries, keys, values)
    logit_mix, weight_mix = (m.float().contiguous() for m in (logit_mix, weight_mix))
    batch, heads, num_queries, width = q.shape
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=values.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    grid = lambda meta: (triton.cdiv(num_queries, meta['BLOCK_M']), batch)  # noqa: E731
    _forward_kernel[grid](q, k, v, logit_mix, weight_mix, out, lse, num_queries,
                          k.shape[-2], width, v.shape[-1], **_sizes(q, v))
    return out, lse


@torch.library.custom_op('vitdense::talking_heads_triton_backward', mutates_args=(),
                         device_types=('cuda', 'cpu'))
def _talking_heads_triton_backward(grad: Tensor, queries: Tensor, keys: Tensor,
                                   values: Tensor, logit_mix: Tensor, weight_mix: Tensor,
                                   lse: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor,
                                                         Tensor]:
    """Gradients of :func:`talking_heads_triton`'s output for its five inputs, every tile
    recomputed from the inputs and the rows' log-sum-exp."""
    q, k, v, grad = _operands(queries, keys, values, grad)
    mixes = tuple(m.float().contiguous() for m in (logit_mix, weight_mix))
    batch, heads, num_queries, width = q.shape
    dq, dk, dv = (torch.zeros(t.shape, dtype=torch.float32, device=t.device)
                  for t in (q, k, v))
    d_mixes = tuple(torch.zeros_like(m) for m in mixes)
    grid = lambda meta: (triton.cdiv(num_queries, meta['BLOCK_M']), batch)  # noqa: E731
    _backward_kernel[grid](grad, q, k, v, *mixes, lse.contiguous(), dq, dk, dv, *d_mixes,
                           num_queries, k.shape[-2], width, v.shape[-1], **_sizes(q, v))
    inputs = (queries, keys, values, logit_mix, weight_mix)
    return tuple(g.to(t.dtype) for g, t in zip((dq, dk, dv, *d_mixes), inputs))


@talking_heads_triton.register_fake
def _(queries: Tensor, keys: Tensor, values: Tensor, logit_mix: Tensor,
      weight_mix: Tensor) -> tuple[Tensor, Tensor]:
    rows = queries.shape[:-1]
    return (values.new_empty(*rows, values.shape[-1]),
            queries.new_empty(rows, dtype=torch.float32))


@_talking_heads_triton_backward.register_fake
def _(grad: Tensor, queries: Tensor, keys: Tensor, values: Tensor, logit_mix: Tensor,
      weight_mix: Tensor, lse: Tensor) -> tuple[Tensor, ...]:
    return tuple(t.new_empty(t.shape) for t in (queries, keys, values, logit_mix, weight_mix))


def _setup_context(ctx, inputs: tuple[Tensor, ...], output: tuple[Tensor, Tensor]) -> None:
    ctx.save_for_backward(*inputs, output[1])
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, grad: Tensor, _: Optional[Tensor]) -> tuple[Tensor, ...]:
    return _talking_heads_triton_backward(grad, *ctx.saved_tensors)


talking_heads_triton.register_autograd(_backward, setup_context=_setup_context)
