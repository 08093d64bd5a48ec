"""Talking heads' forward Triton kernels, in two passes (an online post-mix would carry
``P_g v_h`` for every pair of heads): :func:`lse_kernel` keeps each row's running maximum and
sum of ``2^(S̃ log₂e)`` and stores the log-sum-exp (base 2); :func:`forward_kernel` forms
``P_h`` exactly from it, mixes and multiplies by the values, its program's output heads
only. Notation in :mod:`.talking_heads_triton`."""
import triton
import triton.language as tl

from .talking_heads_triton_tiles import (LOG2E, SLICE, add_products, autotuned, load_heads,
                                         loaded_products, mixed, mixed_weights, products,
                                         store_slices, zeros)


@triton.jit
def query_block(q_ptr, rows, num_queries, HEADS: tl.constexpr, WIDTH: tl.constexpr,
                RESIDENT: tl.constexpr):
    """A block of query rows' slices of every head, kept in registers over the keys if
    ``RESIDENT``, else none: read per block of keys (float32's spill otherwise)."""
    if RESIDENT:
        q = load_heads(q_ptr, 0, rows, num_queries, WIDTH, HEADS, (WIDTH + SLICE - 1) // SLICE)
    else:
        q = ()
    return q


@triton.jit
def block_logits(q, q_ptr, rows, num_queries, k_ptr, keys, num_keys, live,
                 HEADS: tl.constexpr, WIDTH: tl.constexpr, RESIDENT: tl.constexpr,
                 PRECISION: tl.constexpr):
    """Every head's logits ``q·k`` of a block of queries (:func:`query_block`) and keys."""
    slices: tl.constexpr = (WIDTH + SLICE - 1) // SLICE
    if RESIDENT:
        logits = products(q, load_heads(k_ptr, 0, keys, num_keys, WIDTH, HEADS, slices),
                          HEADS, slices, PRECISION)
    else:
        logits = loaded_products(q_ptr, rows, num_queries, k_ptr, keys, num_keys, WIDTH,
                                 live, HEADS, slices, PRECISION)
    return logits


@autotuned('lse')
@triton.jit
def lse_kernel(q_ptr, k_ptr, wl_ptr, lse_ptr, num_queries, num_keys, TOKENS_P2,
               HEADS: tl.constexpr, WIDTH: tl.constexpr, DIMS: tl.constexpr,
               RESIDENT: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """Each (head, row)'s log-sum-exp (base 2) of the mixed logits of one block of query
    rows, in one pass over the keys with the sum kept relative to the running maximum."""
    image = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    q_ptr += image * HEADS * num_queries * WIDTH
    q = query_block(q_ptr, rows, num_queries, HEADS, WIDTH, RESIDENT)
    k_ptr += image * HEADS * num_keys * WIDTH
    row_max = ()
    for h in tl.static_range(HEADS):
        row_max = row_max + (tl.full([BLOCK_M], float('-inf'), tl.float32),)
    total = zeros(HEADS, BLOCK_M, 0)
    for start in range(0, num_keys, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        live = start < num_keys
        logits = block_logits(q, q_ptr, rows, num_queries, k_ptr, keys, num_keys, live,
                              HEADS, WIDTH, RESIDENT, PRECISION)
        new_max, new_total = (), ()
        for h in tl.static_range(HEADS):
            head = tl.where(keys[None, :] < num_keys,
                            mixed(wl_ptr, logits, h, LOG2E, live, HEADS), float('-inf'))
            largest = tl.maximum(row_max[h], tl.max(head, axis=1))
            new_total = new_total + (total[h] * tl.exp2(row_max[h] - largest) +
                                     tl.sum(tl.exp2(head - largest[:, None]), axis=1),)
            new_max = new_max + (largest,)
        row_max, total = new_max, new_total
    for h in tl.static_range(HEADS):
        tl.store(lse_ptr + (image * HEADS + h) * num_queries + rows,
                 row_max[h] + tl.log2(total[h]), mask=rows < num_queries)


@autotuned('forward')
@triton.jit
def forward_kernel(q_ptr, k_ptr, v_ptr, wl_ptr, ww_ptr, lse_ptr, out_ptr, num_queries,
                   num_keys, TOKENS_P2, HEADS: tl.constexpr, WIDTH: tl.constexpr,
                   DIMS: tl.constexpr, GROUP: tl.constexpr, RESIDENT: tl.constexpr,
                   PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The output heads ``P̂_h v_h`` of one group of heads and block of query rows, each
    head's weights ``P_g`` mixed in as they are formed."""
    image, first = tl.program_id(1), tl.program_id(2) * GROUP
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dim_slices: tl.constexpr = (DIMS + SLICE - 1) // SLICE
    q_ptr += image * HEADS * num_queries * WIDTH
    q = query_block(q_ptr, rows, num_queries, HEADS, WIDTH, RESIDENT)
    lse_ptr += image * HEADS * num_queries
    k_ptr += image * HEADS * num_keys * WIDTH
    v_ptr += image * HEADS * num_keys * DIMS
    out = zeros(GROUP * dim_slices, BLOCK_M, SLICE)
    for start in range(0, num_keys, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        live = start < num_keys
        logits = block_logits(q, q_ptr, rows, num_queries, k_ptr, keys, num_keys, live,
                              HEADS, WIDTH, RESIDENT, PRECISION)
        weights = mixed_weights(logits, lse_ptr, wl_ptr, ww_ptr, rows, keys, num_queries,
                                num_keys, first, live, HEADS, GROUP, BLOCK_M, BLOCK_N)
        v = load_heads(v_ptr, first, keys, num_keys, DIMS, GROUP, dim_slices)
        out = add_products(out, weights, v, GROUP, dim_slices, PRECISION, False)
    out_ptr += image * HEADS * num_queries * DIMS
    for h in tl.static_range(GROUP):
        store_slices(out_ptr + (first + h) * num_queries * DIMS,
                     out[h * dim_slices:(h + 1) * dim_slices], rows, num_queries, DIMS,
                     dim_slices)
