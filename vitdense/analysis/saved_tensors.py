"""What a GPU's training step keeps, counted on any device: CUDA autocast's float16 casting
rules as a ``TorchFunctionMode`` (the meta device has no autocast), ``scaled_dot_product_attention``
as the fused kernel a GPU runs (q, k, v, output and a log-sum-exp per row, not an N × N map),
and the storages the forward saves for backward, each counted once. The parts of
:mod:`vitdense.analysis.memory`'s account that know nothing of configs."""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator, Optional

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

HALF = torch.float16
#: torch functions CUDA autocast runs in half precision (torch.amp docs, "CUDA Ops that can
#: autocast to float16"), by name
HALF_OPS = frozenset({
    'linear', 'conv1d', 'conv2d', 'conv3d', 'conv_transpose1d', 'conv_transpose2d',
    'conv_transpose3d', 'matmul', '__matmul__', '__rmatmul__', 'mm', 'bmm', 'baddbmm',
    'addmm', 'addbmm', 'addmv', 'addr', 'mv', 'prelu', 'scaled_dot_product_attention',
})
#: those it runs in float32 ("CUDA Ops that can autocast to float32")
FLOAT_OPS = frozenset({
    '__pow__', '__rpow__', '__rdiv__', '__rtruediv__', 'pow', 'acos', 'asin', 'cosh', 'sinh',
    'tan', 'exp', 'expm1', 'log', 'log10', 'log1p', 'log2', 'erfinv', 'reciprocal', 'rsqrt',
    'layer_norm', 'group_norm', 'norm', 'normalize', 'softmax', 'log_softmax', 'softmin',
    'softplus', 'sum', 'prod', 'cumsum', 'cumprod', 'cdist', 'pdist', 'dist', 'renorm',
    'cosine_similarity', 'cross_entropy', 'nll_loss', 'binary_cross_entropy_with_logits',
    'l1_loss', 'smooth_l1_loss', 'mse_loss', 'kl_div', 'poisson_nll_loss',
})

#: those it runs in the widest floating type of their arguments ("CUDA Ops that promote to
#: the widest input type") and that do not promote by themselves: deformable attention's
#: sampling (mmcv's pure-torch path, which Mask2Former's pixel decoder takes on a CPU)
WIDEST_OPS = frozenset({'grid_sample', 'grid_sampler'})

#: kernels a GPU runs in half precision that a CPU lacks in it (RoIAlign) or runs ~20x slower
#: than in float32 without bfloat16 units (convolutions and matrix products: a detector's
#: heads at 1024² took tens of minutes): on real tensors they compute in float32 on float32
#: copies of their arguments and their outputs are cast back, and what they save is counted
#: as the half-precision arguments the copies stand in for (:meth:`SavedTensors.standing_in`)
FLOAT_KERNELS_ON_CPU = frozenset({'roi_align', 'conv2d', 'linear'})


def _cast(value: Any, dtype: torch.dtype,
          copies: Optional[list[tuple[torch.Tensor, torch.Tensor]]] = None) -> Any:
    """``value`` (a tensor, or nested lists and tuples) with its floating tensors in ``dtype``;
    each (copy, original) pair made is appended to ``copies`` where given."""
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
        copy_ = value.to(dtype)
        if copies is not None:
            copies.append((copy_, value))
        return copy_
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype, copies) for v in value)
    return value


class HalfPrecisionPolicy(TorchFunctionMode):
    """CUDA autocast's casting rules, on any device (the meta device has no autocast):
    arguments of the half-precision ops are cast to ``dtype``, those of the float32 ops
    to float32; every other op runs in the dtypes it is given (type promotion), as under
    autocast. The casts are new tensors, saved where the op saves its inputs, as autocast's
    are (its cache of cast weights aside: each weight is used once per step here).

    On real tensors the :data:`FLOAT_KERNELS_ON_CPU` compute in float32; ``saved``, the
    count of the step, counts what they save as the half-precision tensors a GPU saves."""

    def __init__(self, dtype: torch.dtype = HALF,
                 saved: Optional['SavedTensors'] = None) -> None:
        super().__init__()
        self.dtype = dtype
        self.saved = saved

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, '__name__', '').split('.')[0]
        if name in HALF_OPS:
            args, kwargs = _cast(args, self.dtype), {k: _cast(v, self.dtype)
                                                     for k, v in kwargs.items()}
        elif name in FLOAT_OPS and kwargs.get('dtype') is None:
            args, kwargs = _cast(args, torch.float32), {k: _cast(v, torch.float32)
                                                        for k, v in kwargs.items()}
        elif name in WIDEST_OPS:
            floating = [a.dtype for a in args if isinstance(a, torch.Tensor)
                        and a.is_floating_point()]
            if floating:
                args = _cast(args, max(floating, key=lambda dtype: dtype.itemsize))
        if name in FLOAT_KERNELS_ON_CPU and not _on_meta(args):
            return self._in_float32(func, args, kwargs)
        return func(*args, **kwargs)

    def _in_float32(self, func, args: tuple, kwargs: dict) -> Any:
        """``func`` on float32 copies of its arguments, its outputs in the dtype of its
        first tensor argument."""
        dtype = next(a.dtype for a in args if isinstance(a, torch.Tensor))
        copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        args = _cast(args, torch.float32, copies)
        kwargs = {k: _cast(v, torch.float32, copies) for k, v in kwargs.items()}
        standing_in = self.saved.standing_in(copies) if self.saved is not None \
            else contextlib.nullcontext()
        with standing_in:
            return _cast(func(*args, **kwargs), dtype)


def _on_meta(args: tuple) -> bool:
    return any(isinstance(a, torch.Tensor) and a.is_meta for a in args)


class _FusedAttention(torch.autograd.Function):
    """``scaled_dot_product_attention`` as a fused GPU kernel (and torch's CPU one) keeps it
    for backward: q, k, v, the output and a float32 log-sum-exp per query row. Shapes only
    (meta device)."""

    @staticmethod
    def forward(ctx, query, key, value):
        # laid out (..., N, heads, d) as the fused kernels write it: merging heads is a view
        *lead, heads, num_queries, _ = query.shape
        out = query.new_empty(*lead, num_queries, heads, value.shape[-1]).transpose(-3, -2)
        ctx.save_for_backward(query, key, value, out,
                              query.new_empty(query.shape[:-1], dtype=torch.float32))
        return out

    @staticmethod
    def backward(ctx, grad):
        query, key, value = ctx.saved_tensors[:3]
        return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


@contextlib.contextmanager
def fused_attention_on_meta() -> Iterator[None]:
    """Within: SDPA on meta tensors is :class:`_FusedAttention`; on real ones unchanged
    (torch's CPU kernel is itself fused: it saves the same five tensors)."""
    original = F.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, *args, **kwargs):
        if query.is_meta and attn_mask is None:
            return _FusedAttention.apply(query, key, value)
        return original(query, key, value, attn_mask, *args, **kwargs)

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


#: what a graph holds of a saved tensor counted by ``SavedTensors(keep=False)``
NOT_KEPT = object()


class SavedTensors:
    """Bytes of the distinct storages saved for backward inside the context, besides those
    of ``exclude`` (the parameters, counted on their own).

    ``keep=False`` counts without keeping: the graph holds a placeholder instead of each
    saved tensor (no backward can run), so a real forward's saved storages are freed as the
    forward lets them go and the count takes the memory of the forward's live tensors only.
    A freed storage stays counted, and its key is released for the storages made after it."""

    def __init__(self, exclude: tuple[torch.Tensor, ...] = (), keep: bool = True) -> None:
        self.excluded = {_storage_key(t) for t in exclude}
        self.storages: dict[int, int] = {}
        self.keep = keep
        self.freed = 0  # bytes of counted storages freed since (``keep=False``)
        #: storage key of a float32 stand-in copy -> the half-precision tensor it stands in for
        self.stand_ins: dict[int, torch.Tensor] = {}

    def _count(self, tensor: torch.Tensor) -> None:
        key = _storage_key(tensor)
        if key in self.excluded or key in self.storages:
            return
        storage = tensor.untyped_storage()
        self.storages[key] = storage.nbytes()
        if not self.keep:  # the storage's Python object lives as long as the storage
            weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.freed += self.storages.pop(key)

    def _pack(self, tensor: torch.Tensor) -> Any:
        original = self.stand_ins.get(_storage_key(tensor))
        self._count(tensor if original is None else original)
        if not self.keep:
            return NOT_KEPT
        if original is None:
            return tensor
        # the graph keeps the original, as a GPU's kernel would, not the float32 copy
        return original, tensor.size(), tensor.stride(), tensor.storage_offset()

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        if packed is NOT_KEPT:
            raise RuntimeError('a graph counted with SavedTensors(keep=False) has no saved '
                               'tensors: count with keep=True to run its backward')
        if isinstance(packed, torch.Tensor):
            return packed
        original, size, stride, offset = packed  # the copy (or its view) made again
        return original.to(torch.float32).as_strided(size, stride, offset)

    @property
    def bytes(self) -> int:
        return sum(self.storages.values()) + self.freed

    @contextlib.contextmanager
    def recording(self) -> Iterator['SavedTensors']:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield self

    @contextlib.contextmanager
    def standing_in(self, copies: list[tuple[torch.Tensor, torch.Tensor]]) -> Iterator[None]:
        """Within: what is saved of each (float32 copy, original) pair's copy, or of a view
        of it, is the original: counted as the original and kept in its place."""
        self.stand_ins = {_storage_key(copy_): original for copy_, original in copies}
        try:
            yield
        finally:
            self.stand_ins = {}


def _storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


class _DeformableAttentionKernel(torch.autograd.Function):
    """mmcv's multi-scale deformable attention as its GPU kernel keeps it for backward: the
    values, the levels' shapes, and the sampling locations and attention weights cast to the
    values' dtype; the output is computed by ``compute`` (mmcv's torch path) outside the
    graph, so its per-level sampled maps are neither kept nor counted. Counting only: its
    backward gives no gradients."""

    @staticmethod
    def forward(ctx, value, shapes, locations, weights, compute):
        locations, weights = locations.type_as(value), weights.type_as(value)
        ctx.save_for_backward(value, shapes, locations, weights)
        with torch.no_grad():
            return compute(value, shapes, locations, weights)

    @staticmethod
    def backward(ctx, grad):
        return None, None, None, None, None


@contextlib.contextmanager
def deformable_attention_as_on_gpu() -> Iterator[None]:
    """Within: mmcv's deformable attention on a CPU keeps what its GPU kernel keeps
    (:class:`_DeformableAttentionKernel`) instead of its torch path's sampled maps."""
    from mmcv.ops import multi_scale_deform_attn

    original = multi_scale_deform_attn.multi_scale_deformable_attn_pytorch

    def kernel(value, shapes, locations, weights):
        return _DeformableAttentionKernel.apply(value, shapes, locations, weights, original)

    multi_scale_deform_attn.multi_scale_deformable_attn_pytorch = kernel
    try:
        yield
    finally:
        multi_scale_deform_attn.multi_scale_deformable_attn_pytorch = original
