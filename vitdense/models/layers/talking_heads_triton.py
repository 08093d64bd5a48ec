"""Talking heads in Triton kernels laid out for the tensor cores: no map in memory.

Every head is its own 2-D tile, and the heads are unrolled at compile time (tuples of tiles
built in ``tl.static_range``): all heads' (rows, keys) tiles share one MMA layout, so element
(i, j) of every head sits in the same thread and both mixes are in-thread multiply-adds.
Widths are cut into slices of :data:`SLICE` columns (48 = 3 × 16: no padding to 64), each
one ``tl.dot`` into the same accumulator. Notation (queries pre-scaled): ``S_g = q_g k_gᵀ``,
``S̃_h = Σ_g Wl[h,g] S_g``, ``P_h = softmax(S̃_h)``, ``P̂_h = Σ_g Ww[h,g] P_g``, output
``P̂_h v_h``.

- Forward, two passes (an online post-mix would carry ``P_g v_h`` for every pair of heads):
  :func:`_lse_kernel` keeps each row's running maximum and sum of ``2^(S̃ log₂e)`` and stores
  the log-sum-exp (base 2); :func:`_forward_kernel` forms ``P_h`` exactly from it, mixes and
  multiplies by the values, its program's output heads only (:data:`GROUP_PAIRS`).
- Backward in FlashAttention-2's structure, every tile recomputed from q, k, v and the rows'
  log-sum-exp, each output element written by one program, no atomics, so the gradients
  are the same bits from run to run: :func:`_delta_kernel` (query blocks) sums
  ``E_hg = Σ_j P_g ∘ dP̂_h`` per row, which gives the softmax's ``D_g = Σ_h Ww[h,g] E_hg``
  and ``dWw[h,g] = Σ_i E_hg``; :func:`_dkdv_kernel` (key blocks) ``dk`` and, run again,
  ``dv``; :func:`_dq_kernel` (query blocks) ``dq`` and per-row ``Σ_j dS̃_h ∘ S_g``, whose
  sum is ``dWl``. The per-row partials of the mixes' gradients are summed by torch afterwards.
- Live state is bounded by splitting heads across programs (:data:`GROUP_PAIRS`): a program
  keeps the accumulators of its group's heads only, recomputing the all-heads tiles.

Both directions are registered operators (``vitdense::talking_heads_triton``), so autograd,
``torch.compile`` and the memory account see one call. CUDA tensors run the compiled
kernels; CPU tensors run them in Triton's interpreter when ``TRITON_INTERPRET=1`` was set
before Triton was imported (how the tests check them). Half-precision inputs are multiplied
with float32 accumulation; the mixes, the softmax and its statistics are float32, and the
weights are rounded to the operands' precision for the products (as flash attention does);
float32 inputs multiply in full precision (no TF32).
"""
import math
from typing import Callable, NamedTuple, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

#: columns of one slice of a head's width (the tensor cores' K step)
SLICE = tl.constexpr(16)
#: ``log₂ e``: the exponentials are ``exp2`` of logits in base 2
LOG2E = tl.constexpr(math.log2(math.e))
#: (query rows, key columns, pipeline stages, warps) of a program, per kernel: one
#: warpgroup, so that every dot of a kernel shares one MMA layout; candidates past the first
#: are kept for up to :data:`WIDE_HEADS` heads only (their live state grows with the heads)
BLOCKS = {'lse': ((64, 16, 1, 4),), 'forward': ((64, 16, 1, 4),), 'delta': ((64, 16, 1, 4),),
          'dkdv': ((16, 64, 1, 4),), 'dq': ((64, 16, 1, 4),)}
WIDE_HEADS = 8
#: per kernel, how many (group head, head) pairs one program's live state may hold, in half
#: precision and in float32: its group is the largest divisor of the heads within that (one
#: head at least); chosen by sm_90a's registers at 8 heads of 48
#: (benchmarks/triton_registers.py, docs/memory.md)
GROUP_PAIRS = {'forward': 16, 'delta': 16, 'dkdv': 8, 'dq': 8}
FLOAT32_GROUP_PAIRS = {'forward': 16, 'delta': 8, 'dkdv': 4, 'dq': 4}
INTERPRETING = triton.knobs.runtime.interpret


def group_size(kernel: str, heads: int, dtype: torch.dtype) -> int:
    """Heads per program of ``kernel`` for operands of ``dtype`` (every kernel but the
    log-sum-exp pass splits its output heads across programs, :data:`GROUP_PAIRS`)."""
    pairs = (FLOAT32_GROUP_PAIRS if dtype == torch.float32 else GROUP_PAIRS)[kernel]
    return max(g for g in range(1, heads + 1)
               if heads % g == 0 and (g == 1 or g * heads <= pairs))


def _configs(kernel: str) -> list[triton.Config]:
    """Autotuning candidates; the interpreter takes the smallest blocks only (each
    candidate would run in it), so that small test grids span several blocks."""
    blocks = BLOCKS[kernel][:1] if INTERPRETING else BLOCKS[kernel]
    return [triton.Config({'BLOCK_M': m, 'BLOCK_N': n}, num_warps=w, num_stages=s)
            for m, n, s, w in blocks]


def _choosable(configs: list[triton.Config], heads: int) -> list[triton.Config]:
    """Of a kernel's candidates, those the autotuner may choose at ``heads``."""
    return configs if heads <= WIDE_HEADS else configs[:1]


def _prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    return _choosable(configs, kwargs.get('HEADS', named_args.get('HEADS')))


def _autotuned(kernel: str, key: tuple[str, ...] = ()) -> Callable:
    """Autotuning per head count, widths, dtype and token count (rounded to a power of
    two: one tuning per size class) over the kernel's few candidates."""
    return triton.autotune(configs=_configs(kernel),
                           key=['HEADS', 'WIDTH', 'DIMS', 'TOKENS_P2', *key],
                           prune_configs_by={'early_config_prune': _prune})


@triton.jit
def _load_slices(ptr, rows, num_rows, width, SLICES: tl.constexpr, live=True):
    """The (rows, :data:`SLICE`) slices of a (num_rows, width) matrix, zero outside it (and
    everywhere unless ``live``)."""
    cols = tl.arange(0, SLICE)
    slices = ()
    for c in tl.static_range(SLICES):
        mask = (rows[:, None] < num_rows) & (c * SLICE + cols[None, :] < width) & live
        slices = slices + (tl.load(ptr + rows[:, None] * width + c * SLICE + cols[None, :],
                                   mask=mask, other=0.),)
    return slices


@triton.jit
def _store_slices(ptr, slices, rows, num_rows, width, SLICES: tl.constexpr):
    """Store (rows, :data:`SLICE`) slices into a (num_rows, width) matrix."""
    cols = tl.arange(0, SLICE)
    for c in tl.static_range(SLICES):
        mask = (rows[:, None] < num_rows) & (c * SLICE + cols[None, :] < width)
        tl.store(ptr + rows[:, None] * width + c * SLICE + cols[None, :],
                 slices[c].to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_heads(ptr, first, rows, num_rows, width, HEADS: tl.constexpr,
                SLICES: tl.constexpr, live=True):
    """Heads ``first`` to ``first + HEADS`` of one image's (heads, num_rows, width) tensor,
    as a flat tuple of slices (head-major); ``live`` (true, known at run time only) keeps
    loads inside a loop that do not depend on it from being hoisted out of it."""
    slices = ()
    for h in tl.static_range(HEADS):
        slices = slices + _load_slices(ptr + (first + h) * num_rows * width, rows,
                                       num_rows, width, SLICES, live)
    return slices


@triton.jit
def _products(a, b, HEADS: tl.constexpr, SLICES: tl.constexpr, PRECISION: tl.constexpr):
    """Per head, ``a_h b_hᵀ`` summed over the width's slices (float32)."""
    products = ()
    for h in tl.static_range(HEADS):
        acc = tl.dot(a[h * SLICES], tl.trans(b[h * SLICES]), input_precision=PRECISION)
        for c in tl.static_range(1, SLICES):
            acc = tl.dot(a[h * SLICES + c], tl.trans(b[h * SLICES + c]), acc,
                         input_precision=PRECISION)
        products = products + (acc,)
    return products


@triton.jit
def _loaded_products(a_ptr, a_rows, num_a, b_ptr, b_rows, num_b, width, live,
                     HEADS: tl.constexpr, SLICES: tl.constexpr, PRECISION: tl.constexpr):
    """Per head of one image, ``a_h b_hᵀ`` of the (a_rows, width) and (b_rows, width)
    blocks of its (heads, num_a, width) and (heads, num_b, width) tensors, each head's
    operands loaded just before its product (so that one head's are live at a time)."""
    products = ()
    for h in tl.static_range(HEADS):
        a = _load_slices(a_ptr + h * num_a * width, a_rows, num_a, width, SLICES, live)
        b = _load_slices(b_ptr + h * num_b * width, b_rows, num_b, width, SLICES, live)
        products = products + _products(a, b, 1, SLICES, PRECISION)
    return products


@triton.jit
def _mix(mix_ptr, tiles, first, scale, live, HEADS: tl.constexpr, OUT: tl.constexpr,
         TRANSPOSED: tl.constexpr):
    """``scale · Σ_g mix[h, g] tiles[g]`` for h from ``first`` to ``first + OUT``
    (``TRANSPOSED``: ``mix[g, h]``), in-thread multiply-adds. The mix's weights are loaded
    under ``live``, true but known at run time only, so that they are read per block (from
    cache) rather than hoisted out of the loop into heads² registers."""
    mixed = ()
    for h in tl.static_range(OUT):
        acc = tl.zeros(tiles[0].shape, tl.float32)
        for g in tl.static_range(HEADS):
            if TRANSPOSED:
                weight = tl.load(mix_ptr + g * HEADS + first + h, mask=live, other=0.)
            else:
                weight = tl.load(mix_ptr + (first + h) * HEADS + g, mask=live, other=0.)
            acc += (weight * scale) * tiles[g]
        mixed = mixed + (acc,)
    return mixed


@triton.jit
def _weights(logits, lse_ptr, wl_ptr, rows, keys, num_queries, num_keys, live,
             HEADS: tl.constexpr):
    """Every head's softmax weights ``P_h`` from the logits and the rows' log-sum-exp
    (base 2; one image's (heads, num_queries)), zero outside the image's queries and keys."""
    inside = (rows[:, None] < num_queries) & (keys[None, :] < num_keys)
    weights = ()
    for h in tl.static_range(HEADS):
        mixed = _mix(wl_ptr, logits, h, LOG2E, live, HEADS, 1, False)[0]
        lse = tl.load(lse_ptr + h * num_queries + rows, mask=(rows < num_queries) & live,
                      other=0.)
        weights = weights + (tl.where(inside, tl.exp2(mixed - lse[:, None]), 0.),)
    return weights


@triton.jit
def _query_block(q_ptr, rows, num_queries, HEADS: tl.constexpr, WIDTH: tl.constexpr,
                 RESIDENT: tl.constexpr):
    """A block of query rows' slices of every head, kept in registers over the keys if
    ``RESIDENT``, else none: read per block of keys (float32's spill in the forward and
    Δ kernels)."""
    if RESIDENT:
        q = _load_heads(q_ptr, 0, rows, num_queries, WIDTH, HEADS, (WIDTH + SLICE - 1) // SLICE)
    else:
        q = ()
    return q


@triton.jit
def _block_logits(q, q_ptr, rows, num_queries, k_ptr, keys, num_keys, live,
                  HEADS: tl.constexpr, WIDTH: tl.constexpr, RESIDENT: tl.constexpr,
                  PRECISION: tl.constexpr):
    """Every head's logits ``q·k`` of a block of queries (:func:`_query_block`) and keys."""
    slices: tl.constexpr = (WIDTH + SLICE - 1) // SLICE
    if RESIDENT:
        logits = _products(q, _load_heads(k_ptr, 0, keys, num_keys, WIDTH, HEADS, slices),
                           HEADS, slices, PRECISION)
    else:
        logits = _loaded_products(q_ptr, rows, num_queries, k_ptr, keys, num_keys, WIDTH,
                                  live, HEADS, slices, PRECISION)
    return logits


@_autotuned('lse')
@triton.jit
def _lse_kernel(q_ptr, k_ptr, wl_ptr, lse_ptr, num_queries, num_keys, TOKENS_P2,
                HEADS: tl.constexpr, WIDTH: tl.constexpr, DIMS: tl.constexpr,
                RESIDENT: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr):
    """Each (head, row)'s log-sum-exp (base 2) of the mixed logits of one block of query
    rows, in one pass over the keys with the sum kept relative to the running maximum."""
    image = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    slices: tl.constexpr = (WIDTH + SLICE - 1) // SLICE
    q_ptr += image * HEADS * num_queries * WIDTH
    q = _query_block(q_ptr, rows, num_queries, HEADS, WIDTH, RESIDENT)
    k_ptr += image * HEADS * num_keys * WIDTH
    row_max, total = (), ()
    for h in tl.static_range(HEADS):
        row_max = row_max + (tl.full([BLOCK_M], float('-inf'), tl.float32),)
        total = total + (tl.zeros([BLOCK_M], tl.float32),)
    for start in range(0, num_keys, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        logits = _block_logits(q, q_ptr, rows, num_queries, k_ptr, keys, num_keys,
                               start < num_keys, HEADS, WIDTH, RESIDENT, PRECISION)
        mixed = _mix(wl_ptr, logits, 0,
                     LOG2E, start < num_keys, HEADS, HEADS, False)
        new_max, new_total = (), ()
        for h in tl.static_range(HEADS):
            logits = tl.where(keys[None, :] < num_keys, mixed[h], float('-inf'))
            largest = tl.maximum(row_max[h], tl.max(logits, axis=1))
            new_total = new_total + (total[h] * tl.exp2(row_max[h] - largest) +
                                     tl.sum(tl.exp2(logits - largest[:, None]), axis=1),)
            new_max = new_max + (largest,)
        row_max, total = new_max, new_total
    for h in tl.static_range(HEADS):
        tl.store(lse_ptr + (image * HEADS + h) * num_queries + rows,
                 row_max[h] + tl.log2(total[h]), mask=rows < num_queries)


@_autotuned('forward')
@triton.jit
def _forward_kernel(q_ptr, k_ptr, v_ptr, wl_ptr, ww_ptr, lse_ptr, out_ptr, num_queries,
                    num_keys, TOKENS_P2, HEADS: tl.constexpr, WIDTH: tl.constexpr,
                    DIMS: tl.constexpr, GROUP: tl.constexpr, RESIDENT: tl.constexpr,
                    PRECISION: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The output heads ``P̂_h v_h`` of one group of heads and block of query rows."""
    image, first = tl.program_id(1), tl.program_id(2) * GROUP
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    slices: tl.constexpr = (WIDTH + SLICE - 1) // SLICE
    dim_slices: tl.constexpr = (DIMS + SLICE - 1) // SLICE
    q_ptr += image * HEADS * num_queries * WIDTH
    q = _query_block(q_ptr, rows, num_queries, HEADS, WIDTH, RESIDENT)
    lse_ptr += image * HEADS * num_queries
    k_ptr += image * HEADS * num_keys * WIDTH
    v_ptr += image * HEADS * num_keys * DIMS
    out = ()
    for i in tl.static_range(GROUP * dim_slices):
        out = out + (tl.zeros([BLOCK_M, SLICE], tl.float32),)
    for start in range(0, num_keys, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        logits = _block_logits(q, q_ptr, rows, num_queries, k_ptr, keys, num_keys,
                               start < num_keys, HEADS, WIDTH, RESIDENT, PRECISION)
        weights = _weights(logits, lse_ptr, wl_ptr,
                           rows,
                           keys, num_queries, num_keys, start < num_keys, HEADS)
        mixed = _mix(ww_ptr, weights, first, 1., start < num_keys, HEADS, GROUP, False)
        v = _load_heads(v_ptr, first, keys, num_keys, DIMS, GROUP, dim_slices)
        new = ()
        for h in tl.static_range(GROUP):
            for c in tl.static_range(dim_slices):
                new = new + (tl.dot(mixed[h].to(v[0].dtype), v[h * dim_slices + c],
                                    out[h * dim_slices + c], input_precision=PRECISION),)
        out = new
    out_ptr += image * HEADS * num_queries * DIMS
    for h in tl.static_range(GROUP):
        _store_slices(out_ptr + (first + h) * num_queries * DIMS,
                      out[h * dim_slices:(h + 1) * dim_slices], rows, num_queries, DIMS,
                      dim_slices)


@_autotuned('delta')
@triton.jit
def _delta_kernel(grad_ptr, q_ptr, k_ptr, v_ptr, wl_ptr, lse_ptr, e_ptr, num_queries,
                  num_keys, TOKENS_P2, HEADS: tl.constexpr, WIDTH: tl.constexpr,
                  DIMS: tl.constexpr, GROUP: tl.constexpr, RESIDENT: tl.constexpr,
                  PRECISION: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Per row of one block of queries, ``E_hg = Σ_j P_g ∘ dP̂_h`` for every head g and
    the group's heads h, with ``dP̂_h = dO_h v_hᵀ``."""
    image, first = tl.program_id(1), tl.program_id(2) * GROUP
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    slices: tl.constexpr = (WIDTH + SLICE - 1) // SLICE
    dim_slices: tl.constexpr = (DIMS + SLICE - 1) // SLICE
    q_ptr += image * HEADS * num_queries * WIDTH
    q = _query_block(q_ptr, rows, num_queries, HEADS, WIDTH, RESIDENT)
    grad = _load_heads(grad_ptr + image * HEADS * num_queries * DIMS, first, rows,
                       num_queries, DIMS, GROUP, dim_slices)
    lse_ptr += image * HEADS * num_queries
    k_ptr += image * HEADS * num_keys * WIDTH
    v_ptr += image * HEADS * num_keys * DIMS
    sums = ()
    for i in tl.static_range(GROUP * HEADS):
        sums = sums + (tl.zeros([BLOCK_M], tl.float32),)
    for start in range(0, num_keys, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        logits = _block_logits(q, q_ptr, rows, num_queries, k_ptr, keys, num_keys,
                               start < num_keys, HEADS, WIDTH, RESIDENT, PRECISION)
        weights = _weights(logits, lse_ptr, wl_ptr,
                           rows,
                           keys, num_queries, num_keys, start < num_keys, HEADS)
        v = _load_heads(v_ptr, first, keys, num_keys, DIMS, GROUP, dim_slices)
        d_mixed = _products(grad, v, GROUP, dim_slices, PRECISION)
        new = ()
        for h in tl.static_range(GROUP):
            for g in tl.static_range(HEADS):
                new = new + (sums[h * HEADS + g] + tl.sum(weights[g] * d_mixed[h], axis=1),)
        sums = new
    e_ptr += image * HEADS * HEADS * num_queries
    for h in tl.static_range(GROUP):
        for g in tl.static_range(HEADS):
            tl.store(e_ptr + ((first + h) * HEADS + g) * num_queries + rows,
                     sums[h * HEADS + g], mask=rows < num_queries)


@triton.jit
def _logit_gradients(weights, grad_ptr, v_ptr, delta_ptr, ww_ptr, rows, keys, num_queries,
                     num_keys, live, HEADS: tl.constexpr, DIMS: tl.constexpr,
                     PRECISION: tl.constexpr):
    """Every head's gradient of its mixed logits ``dS̃_g = P_g ∘ (dP_g − D_g)``,
    ``dP_g = Σ_h Ww[h,g] dO_h v_hᵀ``, for one tile of one image."""
    d_mixed = _loaded_products(grad_ptr, rows, num_queries, v_ptr, keys, num_keys, DIMS,
                               live, HEADS, (DIMS + SLICE - 1) // SLICE, PRECISION)
    d_logits = ()
    for g in tl.static_range(HEADS):
        d_weights = _mix(ww_ptr, d_mixed, g, 1., live, HEADS, 1, True)[0]
        delta = tl.load(delta_ptr + g * num_queries + rows, mask=(rows < num_queries) & live,
                        other=0.)
        d_logits = d_logits + (weights[g] * (d_weights - delta[:, None]),)
    return d_logits


@_autotuned('dkdv', ('KEYS',))
@triton.jit
def _dkdv_kernel(grad_ptr, q_ptr, k_ptr, v_ptr, wl_ptr, ww_ptr, lse_ptr, delta_ptr, out_ptr,
                 num_queries, num_keys, TOKENS_P2, HEADS: tl.constexpr, WIDTH: tl.constexpr,
                 DIMS: tl.constexpr, GROUP: tl.constexpr, KEYS: tl.constexpr,
                 PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One block of keys' gradients of the group's heads, over every block of queries:
    ``dk_g = Σ_i dS_gᵀ q_g`` (``dS_g = Σ_h Wl[h,g] dS̃_h``) if ``KEYS``, else
    ``dv_h = Σ_i P̂_hᵀ dO_h`` (one at a time: both accumulators spill at 8 heads)."""
    image, first = tl.program_id(1), tl.program_id(2) * GROUP
    keys = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    slices: tl.constexpr = (WIDTH + SLICE - 1) // SLICE
    dim_slices: tl.constexpr = (DIMS + SLICE - 1) // SLICE
    out_slices: tl.constexpr = slices if KEYS else dim_slices
    k_ptr += image * HEADS * num_keys * WIDTH
    v_ptr += image * HEADS * num_keys * DIMS
    q_ptr += image * HEADS * num_queries * WIDTH
    grad_ptr += image * HEADS * num_queries * DIMS
    lse_ptr += image * HEADS * num_queries
    delta_ptr += image * HEADS * num_queries
    acc = ()
    for i in tl.static_range(GROUP * out_slices):
        acc = acc + (tl.zeros([BLOCK_N, SLICE], tl.float32),)
    for start in range(0, num_queries, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        live = start < num_queries
        logits = _loaded_products(q_ptr, rows, num_queries, k_ptr, keys, num_keys, WIDTH,
                                  live, HEADS, slices, PRECISION)
        weights = _weights(logits, lse_ptr, wl_ptr, rows, keys, num_queries, num_keys, live,
                           HEADS)
        if KEYS:
            d_logits = _logit_gradients(weights, grad_ptr, v_ptr, delta_ptr, ww_ptr, rows,
                                        keys, num_queries, num_keys, live, HEADS, DIMS,
                                        PRECISION)
            mixed = _mix(wl_ptr, d_logits, first, 1., live, HEADS, GROUP, True)
            operands = _load_heads(q_ptr, first, rows, num_queries, WIDTH, GROUP, slices)
        else:
            mixed = _mix(ww_ptr, weights, first, 1., live, HEADS, GROUP, False)
            operands = _load_heads(grad_ptr, first, rows, num_queries, DIMS, GROUP,
                                   dim_slices)
        new = ()
        for h in tl.static_range(GROUP):
            for c in tl.static_range(out_slices):
                new = new + (tl.dot(tl.trans(mixed[h].to(operands[0].dtype)),
                                    operands[h * out_slices + c], acc[h * out_slices + c],
                                    input_precision=PRECISION),)
        acc = new
    width: tl.constexpr = WIDTH if KEYS else DIMS
    for h in tl.static_range(GROUP):
        _store_slices(out_ptr + ((image * HEADS + first + h) * num_keys) * width,
                      acc[h * out_slices:(h + 1) * out_slices], keys, num_keys, width,
                      out_slices)


@_autotuned('dq')
@triton.jit
def _dq_kernel(grad_ptr, q_ptr, k_ptr, v_ptr, wl_ptr, ww_ptr, lse_ptr, delta_ptr, dq_ptr,
               f_ptr, num_queries, num_keys, TOKENS_P2, HEADS: tl.constexpr,
               WIDTH: tl.constexpr, DIMS: tl.constexpr, GROUP: tl.constexpr,
               PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``dq_g = Σ_j dS_g k_g`` of one block of query rows and the group's heads g, and per
    row ``F_hg = Σ_j dS̃_h ∘ S_g`` for every head h (summed to ``dWl``)."""
    image, first = tl.program_id(1), tl.program_id(2) * GROUP
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    slices: tl.constexpr = (WIDTH + SLICE - 1) // SLICE
    dim_slices: tl.constexpr = (DIMS + SLICE - 1) // SLICE
    q_ptr += image * HEADS * num_queries * WIDTH
    grad_ptr += image * HEADS * num_queries * DIMS
    lse_ptr += image * HEADS * num_queries
    delta_ptr += image * HEADS * num_queries
    k_ptr += image * HEADS * num_keys * WIDTH
    v_ptr += image * HEADS * num_keys * DIMS
    dq, sums = (), ()
    for i in tl.static_range(GROUP * slices):
        dq = dq + (tl.zeros([BLOCK_M, SLICE], tl.float32),)
    for i in tl.static_range(GROUP * HEADS):
        sums = sums + (tl.zeros([BLOCK_M], tl.float32),)
    for start in range(0, num_keys, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        live = start < num_keys
        logits = _loaded_products(q_ptr, rows, num_queries, k_ptr, keys, num_keys, WIDTH,
                                  live, HEADS, slices, PRECISION)
        weights = _weights(logits, lse_ptr, wl_ptr, rows, keys, num_queries, num_keys, live,
                           HEADS)
        d_logits = _logit_gradients(weights, grad_ptr, v_ptr, delta_ptr, ww_ptr, rows, keys,
                                    num_queries, num_keys, live, HEADS, DIMS, PRECISION)
        d_queries = _mix(wl_ptr, d_logits, first, 1., live, HEADS, GROUP, True)
        group_logits = _loaded_products(q_ptr + first * num_queries * WIDTH, rows,
                                        num_queries, k_ptr + first * num_keys * WIDTH, keys,
                                        num_keys, WIDTH, live, GROUP, slices, PRECISION)
        group_k = _load_heads(k_ptr, first, keys, num_keys, WIDTH, GROUP, slices)
        new_dq, new_sums = (), ()
        for g in tl.static_range(GROUP):
            for c in tl.static_range(slices):
                new_dq = new_dq + (tl.dot(d_queries[g].to(group_k[0].dtype),
                                          group_k[g * slices + c], dq[g * slices + c],
                                          input_precision=PRECISION),)
            for h in tl.static_range(HEADS):
                new_sums = new_sums + (sums[g * HEADS + h] +
                                       tl.sum(d_logits[h] * group_logits[g], axis=1),)
        dq, sums = new_dq, new_sums
    for g in tl.static_range(GROUP):
        _store_slices(dq_ptr + ((image * HEADS + first + g) * num_queries) * WIDTH,
                      dq[g * slices:(g + 1) * slices], rows, num_queries, WIDTH, slices)
        for h in tl.static_range(HEADS):
            tl.store(f_ptr + ((image * HEADS + h) * HEADS + first + g) * num_queries + rows,
                     sums[g * HEADS + h], mask=rows < num_queries)


#: pointer arguments of the kernels that are float32 whatever the operands' dtype (the
#: mixes, the rows' statistics and the per-row partials)
FLOAT32_POINTERS = ('wl_ptr', 'ww_ptr', 'lse_ptr', 'delta_ptr', 'e_ptr', 'f_ptr')


class Launch(NamedTuple):
    """One kernel's launch: the kernel, its grid's extent past the blocks, its sizes."""
    kernel: triton.runtime.Autotuner
    #: the grid's second and third extents (images, head groups)
    programs: tuple[int, int]
    #: the grid's first extent counts blocks of these tokens with this block size key
    tokens: int
    block: str
    sizes: dict

    @property
    def configs(self) -> list[triton.Config]:
        """The candidates the autotuner may choose for this launch."""
        return _choosable(self.kernel.configs, self.sizes['HEADS'])


def _sizes(heads: int, width: int, dims: int, dtype: torch.dtype, tokens: int) -> dict:
    """The kernels' compile-time sizes and the token count's size class."""
    return dict(TOKENS_P2=triton.next_power_of_2(tokens), HEADS=heads, WIDTH=width,
                DIMS=dims, PRECISION='ieee' if dtype == torch.float32 else 'tf32')


def launches(heads: int, width: int, dims: int, dtype: torch.dtype, batch: int,
             num_queries: int, num_keys: int) -> dict[str, Launch]:
    """Every kernel of both directions with its grid and sizes, by name (what a register
    check compiles, and what the operators launch)."""
    sizes = _sizes(heads, width, dims, dtype, num_keys)
    grouped = {name: dict(sizes, GROUP=group_size(name, heads, dtype))
               for name in ('forward', 'delta', 'dkdv', 'dq')}
    key_blocks = grouped.pop('dkdv')
    grouped['dk'], grouped['dv'] = (dict(key_blocks, KEYS=keys) for keys in (True, False))
    programs = {name: (batch, heads // size['GROUP']) for name, size in grouped.items()}
    grouped['lse'] = dict(sizes, RESIDENT=True)
    for name in ('forward', 'delta'):
        grouped[name]['RESIDENT'] = dtype != torch.float32
    return {'lse': Launch(_lse_kernel, (batch, 1), num_queries, 'BLOCK_M', grouped['lse']),
            'forward': Launch(_forward_kernel, programs['forward'], num_queries, 'BLOCK_M',
                              grouped['forward']),
            'delta': Launch(_delta_kernel, programs['delta'], num_queries, 'BLOCK_M',
                            grouped['delta']),
            'dk': Launch(_dkdv_kernel, programs['dk'], num_keys, 'BLOCK_N', grouped['dk']),
            'dv': Launch(_dkdv_kernel, programs['dv'], num_keys, 'BLOCK_N', grouped['dv']),
            'dq': Launch(_dq_kernel, programs['dq'], num_queries, 'BLOCK_M',
                         grouped['dq'])}


def _launch(launch: Launch, *args) -> None:
    grid = lambda meta: (triton.cdiv(launch.tokens, meta[launch.block]),  # noqa: E731
                         *launch.programs)
    launch.kernel[grid](*args, **launch.sizes)


def _operands(*tensors: Tensor) -> tuple[Tensor, ...]:
    """Contiguous operands in one dtype (under autocast the logit terms' columns may be
    float32 beside half-precision queries)."""
    dtype = tensors[0].dtype
    for tensor in tensors[1:]:
        dtype = torch.promote_types(dtype, tensor.dtype)
    return tuple(t.to(dtype).contiguous() for t in tensors)


def _check(queries: Tensor, keys: Tensor, values: Tensor, logit_mix: Tensor) -> None:
    heads = queries.shape[1]
    if keys.shape[:2] != queries.shape[:2] or keys.shape[-1] != queries.shape[-1] or \
            values.shape[:-1] != keys.shape[:-1] or logit_mix.shape != (heads, heads):
        raise ValueError(
            'talking_heads_triton takes (B, heads, Nq, w) queries, (B, heads, N, w) keys, '
            f'(B, heads, N, d) values and (heads, heads) mixes; got {tuple(queries.shape)}, '
            f'{tuple(keys.shape)}, {tuple(values.shape)}, {tuple(logit_mix.shape)}')


@torch.library.custom_op('vitdense::talking_heads_triton', mutates_args=(),
                         device_types=('cuda', 'cpu'))
def talking_heads_triton(queries: Tensor, keys: Tensor, values: Tensor, logit_mix: Tensor,
                         weight_mix: Tensor) -> tuple[Tensor, Tensor]:
    """Talking heads of (B, heads, Nq, w) queries (scaled, any logit terms as extra
    columns) over (B, heads, N, w) keys and (B, heads, N, d) values: ``Σ_g Ww[h,g] P_g v_h``,
    (B, heads, Nq, d) in the values' dtype, with ``P_g`` the softmax of the logits mixed by
    ``Wl``; and each row's log-sum-exp (base 2) of the mixed logits, (B, heads, Nq) in
    float32."""
    _check(queries, keys, values, logit_mix)
    q, k, v = _operands(queries, keys, values)
    logit_mix, weight_mix = (m.float().contiguous() for m in (logit_mix, weight_mix))
    batch, heads, num_queries, width = q.shape
    num_keys, dims = v.shape[-2:]
    out = torch.empty(*q.shape[:-1], dims, dtype=values.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    kernels = launches(heads, width, dims, q.dtype, batch, num_queries, num_keys)
    _launch(kernels['lse'], q, k, logit_mix, lse, num_queries, num_keys)
    _launch(kernels['forward'], q, k, v, logit_mix, weight_mix, lse, out, num_queries,
            num_keys)
    return out, lse


@torch.library.custom_op('vitdense::talking_heads_triton_backward', mutates_args=(),
                         device_types=('cuda', 'cpu'))
def _talking_heads_triton_backward(grad: Tensor, queries: Tensor, keys: Tensor,
                                   values: Tensor, logit_mix: Tensor, weight_mix: Tensor,
                                   lse: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor,
                                                         Tensor]:
    """Gradients of :func:`talking_heads_triton`'s output for its five inputs, every tile
    recomputed from the inputs and the rows' log-sum-exp; the mixes' from per-row partials
    summed here."""
    q, k, v, grad = _operands(queries, keys, values, grad)
    mixes = tuple(m.float().contiguous() for m in (logit_mix, weight_mix))
    batch, heads, num_queries, width = q.shape
    num_keys, dims = v.shape[-2:]
    lse = lse.contiguous()
    kernels = launches(heads, width, dims, q.dtype, batch, num_queries, num_keys)
    pair_rows = q.new_empty(batch, heads, heads, num_queries, dtype=torch.float32)
    _launch(kernels['delta'], grad, q, k, v, mixes[0], lse, pair_rows, num_queries,
            num_keys)
    # E[b, h, g, i] = Σ_j P_g dP̂_h: the softmax's row terms and the weight mix's gradient
    deltas = torch.einsum('hg,bhgi->bgi', mixes[1], pair_rows).contiguous()
    d_weight_mix = pair_rows.sum((0, 3))
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    for name, out in (('dk', dk), ('dv', dv)):
        _launch(kernels[name], grad, q, k, v, *mixes, lse, deltas, out, num_queries,
                num_keys)
    _launch(kernels['dq'], grad, q, k, v, *mixes, lse, deltas, dq, pair_rows, num_queries,
            num_keys)
    # F[b, h, g, i] = Σ_j dS̃_h S_g: the logit mix's gradient
    d_logit_mix = pair_rows.sum((0, 3))
    inputs = (queries, keys, values, logit_mix, weight_mix)
    return tuple(g.to(t.dtype) for g, t in zip((dq, dk, dv, d_logit_mix, d_weight_mix),
                                                inputs))


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
