"""Talking heads' backward Triton kernels, in FlashAttention-2's structure: every tile
recomputed from q, k, v and the rows' log-sum-exp, each output element written by one
program, no atomics, so the gradients are the same bits from run to run.

- :func:`delta_kernel` (query blocks) sums ``E_hg = Σ_j P_g ∘ dP̂_h`` per row, which gives
  the softmax's ``D_g = Σ_h Ww[h,g] E_hg`` and ``dWw[h,g] = Σ_i E_hg``;
- :func:`dkdv_kernel` (key blocks) ``dk`` and, run again, ``dv``;
- :func:`dq_kernel` (query blocks) ``dq`` and per row ``F_hg = Σ_j dS̃_h ∘ S_g``, whose sum
  is ``dWl``; its tiles are (keys, rows), the dK/dV kernel's orientation: 16 keys by 64
  rows on 8 warps hold its live state without spilling, 64 rows by 16 keys do not.

The per-row partials of the mixes' gradients are summed by torch afterwards. Each head's
``dP̂_h`` and ``dS̃_h`` is mixed in as it is formed, so that a program keeps two sets of
all-heads tiles live (the logits and ``dP``) besides its group's accumulators. Notation in
:mod:`.talking_heads_triton`.
"""
import triton
import triton.language as tl

from .talking_heads_triton_forward import block_logits, query_block
from .talking_heads_triton_tiles import (SLICE, add_mixed, add_products, autotuned,
                                         load_heads, loaded_products, mixed_weights,
                                         products, row_values, store_slices, weight, zeros)


@autotuned('delta')
@triton.jit
def delta_kernel(grad_ptr, q_ptr, k_ptr, v_ptr, wl_ptr, lse_ptr, e_ptr, num_queries,
                 num_keys, TOKENS_P2, HEADS: tl.constexpr, WIDTH: tl.constexpr,
                 DIMS: tl.constexpr, GROUP: tl.constexpr, RESIDENT: tl.constexpr,
                 PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Per row of one block of queries, ``E_hg = Σ_j P_g ∘ dP̂_h`` for every head g and
    the group's heads h, with ``dP̂_h = dO_h v_hᵀ``."""
    image, first = tl.program_id(1), tl.program_id(2) * GROUP
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dim_slices: tl.constexpr = (DIMS + SLICE - 1) // SLICE
    q_ptr += image * HEADS * num_queries * WIDTH
    q = query_block(q_ptr, rows, num_queries, HEADS, WIDTH, RESIDENT)
    grad = load_heads(grad_ptr + image * HEADS * num_queries * DIMS, first, rows,
                      num_queries, DIMS, GROUP, dim_slices)
    lse_ptr += image * HEADS * num_queries
    k_ptr += image * HEADS * num_keys * WIDTH
    v_ptr += image * HEADS * num_keys * DIMS
    sums = zeros(HEADS * GROUP, BLOCK_M, 0)
    for start in range(0, num_keys, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        live = start < num_keys
        logits = block_logits(q, q_ptr, rows, num_queries, k_ptr, keys, num_keys, live,
                              HEADS, WIDTH, RESIDENT, PRECISION)
        v = load_heads(v_ptr, first, keys, num_keys, DIMS, GROUP, dim_slices, live)
        d_mixed = products(grad, v, GROUP, dim_slices, PRECISION)
        new = ()
        for g in tl.static_range(HEADS):
            weights = weight(logits, g, lse_ptr, wl_ptr, rows, keys, num_queries, num_keys,
                             live, HEADS)
            for h in tl.static_range(GROUP):
                new = new + (sums[g * GROUP + h] + tl.sum(weights * d_mixed[h], axis=1),)
        sums = new
    e_ptr += image * HEADS * HEADS * num_queries
    for g in tl.static_range(HEADS):
        for h in tl.static_range(GROUP):
            tl.store(e_ptr + ((first + h) * HEADS + g) * num_queries + rows,
                     sums[g * GROUP + h], mask=rows < num_queries)


@triton.jit
def image_pointers(grad_ptr, q_ptr, k_ptr, v_ptr, lse_ptr, delta_ptr, num_queries, num_keys,
                   HEADS: tl.constexpr, WIDTH: tl.constexpr, DIMS: tl.constexpr):
    """The pointers to the program's image (``program_id(1)``) of the output's gradient,
    q, k, v and the rows' log-sum-exp and ``D``."""
    queries, keys = tl.program_id(1) * HEADS * num_queries, tl.program_id(1) * HEADS * num_keys
    return (grad_ptr + queries * DIMS, q_ptr + queries * WIDTH, k_ptr + keys * WIDTH,
            v_ptr + keys * DIMS, lse_ptr + queries, delta_ptr + queries)


@triton.jit
def weight_gradients(grad_ptr, v_ptr, ww_ptr, rows, keys, num_queries, num_keys, live,
                     HEADS: tl.constexpr, DIMS: tl.constexpr, PRECISION: tl.constexpr,
                     ROWS: tl.constexpr, COLUMNS: tl.constexpr, KEY_AXIS: tl.constexpr):
    """Every head's gradient of its softmax weights ``dP_g = Σ_h Ww[h,g] dP̂_h``, each
    ``dP̂_h = dO_h v_hᵀ`` mixed in as it is formed, for one (ROWS, COLUMNS) tile of one
    image (keys along ``KEY_AXIS``)."""
    result = zeros(HEADS, ROWS, COLUMNS)
    for h in tl.static_range(HEADS):
        d_mixed = loaded_products(grad_ptr + h * num_queries * DIMS, rows, num_queries,
                                  v_ptr + h * num_keys * DIMS, keys, num_keys, DIMS, live, 1,
                                  (DIMS + SLICE - 1) // SLICE, PRECISION, KEY_AXIS == 0)[0]
        result = add_mixed(result, d_mixed, ww_ptr, h, 0, live, HEADS, HEADS, True)
    return result


@triton.jit
def group_logit_gradients(logits, d_weights, group_logits, sums, wl_ptr, lse_ptr, delta_ptr,
                          rows, keys, num_queries, num_keys, first, live,
                          HEADS: tl.constexpr, GROUP: tl.constexpr, SUMS: tl.constexpr,
                          ROWS: tl.constexpr, COLUMNS: tl.constexpr,
                          KEY_AXIS: tl.constexpr):
    """The group's heads' logit gradients ``dS_g = Σ_h Wl[h,g] dS̃_h`` as (ROWS, COLUMNS)
    tiles (keys along ``KEY_AXIS``), each ``dS̃_h = P_h ∘ (dP_h − D_h)`` mixed in as it is
    formed; and, if ``SUMS``, ``sums`` (h-major) plus each row's ``Σ_j dS̃_h ∘ S_g`` of the
    group's logits ``S_g``."""
    result = zeros(GROUP, ROWS, COLUMNS)
    new = ()
    for h in tl.static_range(HEADS):
        deltas = tl.expand_dims(row_values(delta_ptr, h, rows, num_queries, live), KEY_AXIS)
        d_logits = weight(logits, h, lse_ptr, wl_ptr, rows, keys, num_queries, num_keys, live,
                          HEADS, KEY_AXIS) * (d_weights[h] - deltas)
        result = add_mixed(result, d_logits, wl_ptr, h, first, live, HEADS, GROUP, True)
        if SUMS:
            for g in tl.static_range(GROUP):
                new = new + (sums[h * GROUP + g] +
                             tl.sum(d_logits * group_logits[g], axis=KEY_AXIS),)
    return result, new


@autotuned('dkdv', ('KEYS',))
@triton.jit
def dkdv_kernel(grad_ptr, q_ptr, k_ptr, v_ptr, wl_ptr, ww_ptr, lse_ptr, delta_ptr, out_ptr,
                num_queries, num_keys, TOKENS_P2, HEADS: tl.constexpr, WIDTH: tl.constexpr,
                DIMS: tl.constexpr, GROUP: tl.constexpr, KEYS: tl.constexpr,
                PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One block of keys' gradients of the group's heads, over every block of queries:
    ``dk_g = Σ_i dS_gᵀ q_g`` if ``KEYS``, else ``dv_h = Σ_i P̂_hᵀ dO_h`` (one at a time:
    both accumulators spill at 8 heads)."""
    first = tl.program_id(2) * GROUP
    keys = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    slices: tl.constexpr = (WIDTH + SLICE - 1) // SLICE
    out_slices: tl.constexpr = slices if KEYS else (DIMS + SLICE - 1) // SLICE
    grad_ptr, q_ptr, k_ptr, v_ptr, lse_ptr, delta_ptr = image_pointers(
        grad_ptr, q_ptr, k_ptr, v_ptr, lse_ptr, delta_ptr, num_queries, num_keys, HEADS,
        WIDTH, DIMS)
    acc = zeros(GROUP * out_slices, BLOCK_N, SLICE)
    for start in range(0, num_queries, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        live = start < num_queries
        logits = loaded_products(q_ptr, rows, num_queries, k_ptr, keys, num_keys, WIDTH,
                                 live, HEADS, slices, PRECISION)
        if KEYS:
            d_weights = weight_gradients(grad_ptr, v_ptr, ww_ptr, rows, keys, num_queries,
                                         num_keys, live, HEADS, DIMS, PRECISION, BLOCK_M,
                                         BLOCK_N, 1)
            tiles, _ = group_logit_gradients(logits, d_weights, (), (), wl_ptr, lse_ptr,
                                             delta_ptr, rows, keys, num_queries, num_keys,
                                             first, live, HEADS, GROUP, False, BLOCK_M,
                                             BLOCK_N, 1)
            operands = load_heads(q_ptr, first, rows, num_queries, WIDTH, GROUP, slices, live)
        else:
            tiles = mixed_weights(logits, lse_ptr, wl_ptr, ww_ptr, rows, keys, num_queries,
                                  num_keys, first, live, HEADS, GROUP, BLOCK_M, BLOCK_N)
            operands = load_heads(grad_ptr, first, rows, num_queries, DIMS, GROUP,
                                  out_slices, live)
        acc = add_products(acc, tiles, operands, GROUP, out_slices, PRECISION, True)
    width: tl.constexpr = WIDTH if KEYS else DIMS
    out_ptr += tl.program_id(1) * HEADS * num_keys * width
    for h in tl.static_range(GROUP):
        store_slices(out_ptr + (first + h) * num_keys * width,
                     acc[h * out_slices:(h + 1) * out_slices], keys, num_keys, width,
                     out_slices)


@autotuned('dq')
@triton.jit
def dq_kernel(grad_ptr, q_ptr, k_ptr, v_ptr, wl_ptr, ww_ptr, lse_ptr, delta_ptr, dq_ptr,
              f_ptr, num_queries, num_keys, TOKENS_P2, HEADS: tl.constexpr,
              WIDTH: tl.constexpr, DIMS: tl.constexpr, GROUP: tl.constexpr,
              PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``dq_g = Σ_j dS_g k_g`` of one block of query rows and the group's heads g, and per
    row ``F_hg = Σ_j dS̃_h ∘ S_g`` for every head h (summed to ``dWl``)."""
    image, first = tl.program_id(1), tl.program_id(2) * GROUP
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    slices: tl.constexpr = (WIDTH + SLICE - 1) // SLICE
    grad_ptr, q_ptr, k_ptr, v_ptr, lse_ptr, delta_ptr = image_pointers(
        grad_ptr, q_ptr, k_ptr, v_ptr, lse_ptr, delta_ptr, num_queries, num_keys, HEADS,
        WIDTH, DIMS)
    dq = zeros(GROUP * slices, BLOCK_M, SLICE)
    sums = zeros(HEADS * GROUP, BLOCK_M, 0)
    for start in range(0, num_keys, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        live = start < num_keys
        logits = loaded_products(q_ptr, rows, num_queries, k_ptr, keys, num_keys, WIDTH,
                                 live, HEADS, slices, PRECISION, True)
        d_weights = weight_gradients(grad_ptr, v_ptr, ww_ptr, rows, keys, num_queries,
                                     num_keys, live, HEADS, DIMS, PRECISION, BLOCK_N, BLOCK_M,
                                     0)
        group_logits = loaded_products(q_ptr + first * num_queries * WIDTH, rows,
                                       num_queries, k_ptr + first * num_keys * WIDTH, keys,
                                       num_keys, WIDTH, live, GROUP, slices, PRECISION, True)
        tiles, sums = group_logit_gradients(logits, d_weights, group_logits, sums, wl_ptr,
                                            lse_ptr, delta_ptr, rows, keys, num_queries,
                                            num_keys, first, live, HEADS, GROUP, True,
                                            BLOCK_N, BLOCK_M, 0)
        group_k = load_heads(k_ptr, first, keys, num_keys, WIDTH, GROUP, slices, live)
        dq = add_products(dq, tiles, group_k, GROUP, slices, PRECISION, True)
    for g in tl.static_range(GROUP):
        store_slices(dq_ptr + ((image * HEADS + first + g) * num_queries) * WIDTH,
                     dq[g * slices:(g + 1) * slices], rows, num_queries, WIDTH, slices)
        for h in tl.static_range(HEADS):
            tl.store(f_ptr + ((image * HEADS + h) * HEADS + first + g) * num_queries + rows,
                     sums[h * GROUP + g], mask=rows < num_queries)
