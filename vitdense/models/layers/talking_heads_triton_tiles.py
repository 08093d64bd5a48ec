"""Building blocks of talking heads' Triton kernels: tiles, head mixes, the autotune space.

Every head is its own 2-D tile, and the heads are unrolled at compile time (tuples of tiles
built in ``tl.static_range``): all heads' (rows, keys) tiles share one layout, so element
(i, j) of every head sits in the same thread and both mixes are in-thread multiply-adds.
Widths are cut into slices of :data:`SLICE` columns (48 = 3 × 16: no padding to 64), each
one ``tl.dot`` into the same accumulator. A mix is formed one head at a time
(:func:`mixed`, :func:`add_mixed`), so that a kernel keeps one set of all-heads tiles live
(the logits) besides its own heads' accumulators.
"""
import math
from typing import Callable

import torch
import triton
import triton.language as tl

#: columns of one slice of a head's width (the tensor cores' K step)
SLICE = tl.constexpr(16)
#: ``log₂ e``: the exponentials are ``exp2`` of logits in base 2
LOG2E = tl.constexpr(math.log2(math.e))
#: per kernel and product precision (``'tf32'``: half-precision operands on the tensor
#: cores; ``'ieee'``: float32 operands, full-precision products), the (query rows, key
#: columns, pipeline stages, warps) of a program; candidates past the first are kept for up
#: to :data:`WIDE_HEADS` heads only. Half precision: one warpgroup, so that every dot of a
#: kernel shares one MMA layout, but two for dK/dV and dQ (they spill on one; their tiles
#: are 16 × 64, 16 queries × 64 keys for dK/dV, 16 keys × 64 queries for dQ); float32
#: (multiply-adds, no MMA layout to share): 8 warps, half the registers per tile. On sm_90a
#: at 4 and 8 heads of 48 none spills (``benchmarks/triton_registers.py``, docs/memory.md).
BLOCKS = {'lse': {'tf32': ((64, 16, 1, 4),), 'ieee': ((64, 16, 1, 8),)},
          'forward': {'tf32': ((64, 16, 1, 4),), 'ieee': ((64, 16, 1, 8),)},
          'delta': {'tf32': ((64, 16, 1, 4),), 'ieee': ((32, 16, 1, 8),)},
          'dkdv': {'tf32': ((16, 64, 1, 8),), 'ieee': ((16, 16, 1, 8),)},
          'dq': {'tf32': ((64, 16, 1, 8),), 'ieee': ((64, 16, 1, 8),)}}
WIDE_HEADS = 8
#: per kernel, how many (group head, head) pairs one program's live state may hold, in half
#: precision and in float32: its group is the largest divisor of the heads within that (one
#: head at least); chosen by sm_90a's registers at 4 and 8 heads of 48
GROUP_PAIRS = {'forward': 16, 'delta': 16, 'dk': 4, 'dv': 8, 'dq': 4}
FLOAT32_GROUP_PAIRS = {'forward': 16, 'delta': 8, 'dk': 4, 'dv': 8, 'dq': 4}
INTERPRETING = triton.knobs.runtime.interpret


def group_size(kernel: str, heads: int, dtype: torch.dtype) -> int:
    """Heads per program of ``kernel`` for operands of ``dtype`` (every kernel but the
    log-sum-exp pass splits its output heads across programs, :data:`GROUP_PAIRS`)."""
    pairs = (FLOAT32_GROUP_PAIRS if dtype == torch.float32 else GROUP_PAIRS)[kernel]
    return max(g for g in range(1, heads + 1)
               if heads % g == 0 and (g == 1 or g * heads <= pairs))


def precision(dtype: torch.dtype) -> str:
    """The products' precision for operands of ``dtype`` (no TF32 for float32)."""
    return 'ieee' if dtype == torch.float32 else 'tf32'


def _blocks(kernel: str, product_precision: str, heads: int) -> tuple[tuple[int, ...], ...]:
    """The (rows, keys, stages, warps) the autotuner may choose; the interpreter takes the
    first only (each candidate would run in it)."""
    blocks = BLOCKS[kernel][product_precision]
    return blocks[:1] if INTERPRETING or heads > WIDE_HEADS else blocks


def _shape(config: triton.Config) -> tuple[int, ...]:
    return (config.kwargs['BLOCK_M'], config.kwargs['BLOCK_N'], config.num_stages,
            config.num_warps)


def choosable(kernel: str, configs: list[triton.Config], heads: int,
              product_precision: str) -> list[triton.Config]:
    """Of ``kernel``'s candidates, those the autotuner may choose at ``heads`` heads."""
    blocks = _blocks(kernel, product_precision, heads)
    return [config for config in configs if _shape(config) in blocks]


def autotuned(kernel: str, key: tuple[str, ...] = ()) -> Callable:
    """Autotuning per head count, widths, precision and token count (rounded to a power of
    two: one tuning per size class) over the kernel's few candidates."""
    shapes = {shape for blocks in BLOCKS[kernel].values() for shape in blocks}
    configs = [triton.Config({'BLOCK_M': m, 'BLOCK_N': n}, num_warps=w, num_stages=s)
               for m, n, s, w in sorted(shapes)]

    def prune(configs: list[triton.Config], named_args: dict,
              **kwargs) -> list[triton.Config]:
        sizes = dict(named_args, **kwargs)
        return choosable(kernel, configs, sizes['HEADS'], sizes['PRECISION'])

    return triton.autotune(configs=configs,
                           key=['HEADS', 'WIDTH', 'DIMS', 'PRECISION', 'TOKENS_P2', *key],
                           prune_configs_by={'early_config_prune': prune})


@triton.jit
def load_slices(ptr, rows, num_rows, width, SLICES: tl.constexpr, live=True):
    """The (rows, :data:`SLICE`) slices of a (num_rows, width) matrix, zero outside it (and
    everywhere unless ``live``, true but known at run time only: it keeps loads inside a
    loop that do not depend on it from being hoisted out of it)."""
    cols = tl.arange(0, SLICE)
    slices = ()
    for c in tl.static_range(SLICES):
        mask = (rows[:, None] < num_rows) & (c * SLICE + cols[None, :] < width) & live
        slices = slices + (tl.load(ptr + rows[:, None] * width + c * SLICE + cols[None, :],
                                   mask=mask, other=0.),)
    return slices


@triton.jit
def store_slices(ptr, slices, rows, num_rows, width, SLICES: tl.constexpr):
    """Store (rows, :data:`SLICE`) slices into a (num_rows, width) matrix."""
    cols = tl.arange(0, SLICE)
    for c in tl.static_range(SLICES):
        mask = (rows[:, None] < num_rows) & (c * SLICE + cols[None, :] < width)
        tl.store(ptr + rows[:, None] * width + c * SLICE + cols[None, :],
                 slices[c].to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def load_heads(ptr, first, rows, num_rows, width, HEADS: tl.constexpr,
               SLICES: tl.constexpr, live=True):
    """Heads ``first`` to ``first + HEADS`` of one image's (heads, num_rows, width) tensor,
    as a flat tuple of slices (head-major)."""
    slices = ()
    for h in tl.static_range(HEADS):
        slices = slices + load_slices(ptr + (first + h) * num_rows * width, rows, num_rows,
                                      width, SLICES, live)
    return slices


@triton.jit
def products(a, b, HEADS: tl.constexpr, SLICES: tl.constexpr, PRECISION: tl.constexpr):
    """Per head, ``a_h b_hᵀ`` summed over the width's slices (float32)."""
    result = ()
    for h in tl.static_range(HEADS):
        acc = tl.dot(a[h * SLICES], tl.trans(b[h * SLICES]), input_precision=PRECISION)
        for c in tl.static_range(1, SLICES):
            acc = tl.dot(a[h * SLICES + c], tl.trans(b[h * SLICES + c]), acc,
                         input_precision=PRECISION)
        result = result + (acc,)
    return result


@triton.jit
def loaded_products(a_ptr, a_rows, num_a, b_ptr, b_rows, num_b, width, live,
                    HEADS: tl.constexpr, SLICES: tl.constexpr, PRECISION: tl.constexpr,
                    TRANSPOSED: tl.constexpr = False):
    """Per head of one image, ``a_h b_hᵀ`` (``b_h a_hᵀ`` if ``TRANSPOSED``) of the
    (a_rows, width) and (b_rows, width) blocks of its (heads, num_a, width) and
    (heads, num_b, width) tensors, each head's operands loaded just before its product (so
    that one head's are live at a time)."""
    result = ()
    for h in tl.static_range(HEADS):
        a = load_slices(a_ptr + h * num_a * width, a_rows, num_a, width, SLICES, live)
        b = load_slices(b_ptr + h * num_b * width, b_rows, num_b, width, SLICES, live)
        if TRANSPOSED:
            result = result + products(b, a, 1, SLICES, PRECISION)
        else:
            result = result + products(a, b, 1, SLICES, PRECISION)
    return result


@triton.jit
def add_products(acc, tiles, operands, COUNT: tl.constexpr, SLICES: tl.constexpr,
                 PRECISION: tl.constexpr, TRANSPOSED: tl.constexpr):
    """``acc[h, c] + tiles[h] · operands[h, c]`` (``tiles[h]ᵀ`` if ``TRANSPOSED``) for
    ``COUNT`` heads of ``SLICES`` slices each (flat, head-major), the tiles cast to the
    operands' dtype."""
    result = ()
    for h in tl.static_range(COUNT):
        tile = tiles[h].to(operands[0].dtype)
        if TRANSPOSED:
            tile = tl.trans(tile)
        for c in tl.static_range(SLICES):
            result = result + (tl.dot(tile, operands[h * SLICES + c], acc[h * SLICES + c],
                                      input_precision=PRECISION),)
    return result


@triton.jit
def zeros(COUNT: tl.constexpr, ROWS: tl.constexpr, COLUMNS: tl.constexpr):
    """``COUNT`` float32 (ROWS, COLUMNS) tiles of zeros (rows only if COLUMNS is 0)."""
    tiles = ()
    for i in tl.static_range(COUNT):
        if COLUMNS == 0:
            tiles = tiles + (tl.zeros([ROWS], tl.float32),)
        else:
            tiles = tiles + (tl.zeros([ROWS, COLUMNS], tl.float32),)
    return tiles


@triton.jit
def mixed(mix_ptr, tiles, head, scale, live, HEADS: tl.constexpr):
    """``scale · Σ_g mix[head, g] tiles[g]``, in-thread multiply-adds. The weights are
    loaded under ``live`` so that they are read per block (from cache) rather than hoisted
    out of the loop into heads² registers."""
    acc = tl.zeros(tiles[0].shape, tl.float32)
    for g in tl.static_range(HEADS):
        acc += (tl.load(mix_ptr + head * HEADS + g, mask=live, other=0.) * scale) * tiles[g]
    return acc


@triton.jit
def add_mixed(acc, tile, mix_ptr, source, first, live, HEADS: tl.constexpr,
              OUT: tl.constexpr, TRANSPOSED: tl.constexpr):
    """``acc[h] + mix[first + h, source] · tile`` for each of ``OUT`` heads
    (``TRANSPOSED``: ``mix[source, first + h]``): one head's term of a mix."""
    result = ()
    for h in tl.static_range(OUT):
        if TRANSPOSED:
            weight = tl.load(mix_ptr + source * HEADS + first + h, mask=live, other=0.)
        else:
            weight = tl.load(mix_ptr + (first + h) * HEADS + source, mask=live, other=0.)
        result = result + (acc[h] + weight * tile,)
    return result


@triton.jit
def weight(logits, head, lse_ptr, wl_ptr, rows, keys, num_queries, num_keys, live,
           HEADS: tl.constexpr, KEY_AXIS: tl.constexpr = 1):
    """Head ``head``'s softmax weights ``P_h`` from every head's logits (keys along
    ``KEY_AXIS`` of the tiles) and the rows' log-sum-exp (base 2; one image's
    (heads, num_queries)), zero outside the image's queries and keys."""
    lse = tl.expand_dims(row_values(lse_ptr, head, rows, num_queries, live), KEY_AXIS)
    inside = tl.expand_dims(rows < num_queries, KEY_AXIS) & \
        tl.expand_dims(keys < num_keys, 1 - KEY_AXIS)
    return tl.where(inside, tl.exp2(mixed(wl_ptr, logits, head, LOG2E, live, HEADS) - lse),
                    0.)


@triton.jit
def mixed_weights(logits, lse_ptr, wl_ptr, ww_ptr, rows, keys, num_queries, num_keys, first,
                  live, HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """The mixed weights ``P̂_h = Σ_g Ww[h,g] P_g`` of the group's heads, each head's
    ``P_g`` mixed in as it is formed."""
    result = zeros(GROUP, BLOCK_M, BLOCK_N)
    for g in tl.static_range(HEADS):
        result = add_mixed(result, weight(logits, g, lse_ptr, wl_ptr, rows, keys,
                                          num_queries, num_keys, live, HEADS),
                           ww_ptr, g, first, live, HEADS, GROUP, False)
    return result


@triton.jit
def row_values(ptr, head, rows, num_rows, live):
    """One head's values of a block of rows of a (heads, num_rows) float32 tensor."""
    return tl.load(ptr + head * num_rows + rows, mask=(rows < num_rows) & live, other=0.)
