"""Talking heads in Triton kernels laid out for the tensor cores: no map in memory.

Notation (queries pre-scaled): ``S_g = q_g k_gᵀ``, ``S̃_h = Σ_g Wl[h,g] S_g``,
``P_h = softmax(S̃_h)``, ``P̂_h = Σ_g Ww[h,g] P_g``, output ``P̂_h v_h``. The kernels:
:mod:`.talking_heads_triton_forward` (two passes: each row's log-sum-exp, then the output)
and :mod:`.talking_heads_triton_backward` (FlashAttention-2's structure without atomics),
built of :mod:`.talking_heads_triton_tiles` (every head its own 2-D tile, the heads unrolled
at compile time, both mixes in-thread multiply-adds). Live state is bounded by splitting
heads across programs (:data:`.talking_heads_triton_tiles.GROUP_PAIRS`): a program keeps
the accumulators of its group's heads only, recomputing the all-heads tiles.

Both directions are registered operators (``vitdense::talking_heads_triton``), so autograd,
``torch.compile`` and the memory account see one call. CUDA tensors run the compiled
kernels; CPU tensors run them in Triton's interpreter when ``TRITON_INTERPRET=1`` was set
before Triton was imported (how the tests check them). Half-precision inputs are multiplied
with float32 accumulation; the mixes, the softmax and its statistics are float32, and the
weights are rounded to the operands' precision for the products (as flash attention does);
float32 inputs multiply in full precision (no TF32).
"""
from typing import NamedTuple

import torch
import triton
from torch import Tensor

from .talking_heads_autograd import register_talking_heads_autograd
from .talking_heads_triton_backward import delta_kernel, dkdv_kernel, dq_kernel
from .talking_heads_triton_forward import forward_kernel, lse_kernel
from .talking_heads_triton_tiles import choosable, group_size, precision

#: pointer arguments of the kernels that are float32 whatever the operands' dtype (the
#: mixes, the rows' statistics and the per-row partials)
FLOAT32_POINTERS = ('wl_ptr', 'ww_ptr', 'lse_ptr', 'delta_ptr', 'e_ptr', 'f_ptr')


class Launch(NamedTuple):
    """One kernel's launch: the kernel, its grid's extent past the blocks, its sizes."""
    kernel: triton.runtime.Autotuner
    #: the kernel's name in :data:`.talking_heads_triton_tiles.BLOCKS`
    name: str
    #: the grid's second and third extents (images, head groups)
    programs: tuple[int, int]
    #: the grid's first extent counts blocks of these tokens with this block size key
    tokens: int
    block: str
    sizes: dict

    @property
    def configs(self) -> list[triton.Config]:
        """The candidates the autotuner may choose for this launch."""
        return choosable(self.name, self.kernel.configs, self.sizes['HEADS'],
                         self.sizes['PRECISION'])


#: per launch: its kernel, its name in :data:`.talking_heads_triton_tiles.BLOCKS`, and
#: whether its grid walks blocks of queries (else of keys)
KERNELS = {'lse': (lse_kernel, 'lse', True), 'forward': (forward_kernel, 'forward', True),
           'delta': (delta_kernel, 'delta', True), 'dk': (dkdv_kernel, 'dkdv', False),
           'dv': (dkdv_kernel, 'dkdv', False), 'dq': (dq_kernel, 'dq', True)}


def _sizes(name: str, heads: int, width: int, dims: int, dtype: torch.dtype,
           tokens: int) -> dict:
    """Kernel ``name``'s compile-time sizes and the token count's size class."""
    sizes = dict(TOKENS_P2=triton.next_power_of_2(tokens), HEADS=heads, WIDTH=width,
                 DIMS=dims, PRECISION=precision(dtype))
    if name != 'lse':
        sizes['GROUP'] = group_size(name, heads, dtype)
    if name in ('lse', 'forward', 'delta'):
        sizes['RESIDENT'] = name == 'lse' or dtype != torch.float32
    if name in ('dk', 'dv'):
        sizes['KEYS'] = name == 'dk'
    return sizes


def launches(heads: int, width: int, dims: int, dtype: torch.dtype, batch: int,
             num_queries: int, num_keys: int) -> dict[str, Launch]:
    """Every kernel of both directions with its grid and sizes, by name (what a register
    check compiles, and what the operators launch)."""
    result = {}
    for name, (kernel, blocks, query_blocks) in KERNELS.items():
        sizes = _sizes(name, heads, width, dims, dtype, num_keys)
        result[name] = Launch(kernel, blocks, (batch, heads // sizes.get('GROUP', heads)),
                              num_queries if query_blocks else num_keys,
                              'BLOCK_M' if query_blocks else 'BLOCK_N', sizes)
    return result


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


register_talking_heads_autograd(talking_heads_triton, _talking_heads_triton_backward)
