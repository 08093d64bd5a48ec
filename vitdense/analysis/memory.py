"""Memory of one training step of a config's whole model (backbone, neck, heads) at its
largest training input, on a GPU, in float32 and under mixed precision; and the time of the
step on this machine. ``tools/analysis_tools/memory.py`` is its command line.

Peak = parameters + gradients + optimizer state (AdamW: two tensors per parameter) + the
activations the forward saves for backward, each storage counted once (views and tensors
saved twice share one), counted with ``torch.autograd.graph.saved_tensors_hooks``. Backward's
transient buffers (one block's gradients at a time) are not included.

The model runs on the meta device (shapes, no memory, no arithmetic), with the kernels a GPU
runs: ``scaled_dot_product_attention`` is a fused kernel that keeps q, k, v, its output and
the row log-sum-exp, as flash attention does (the meta device would otherwise decompose it
into an N × N map). Mixed precision follows CUDA autocast's float16 policy (matrix products
and convolutions in half precision, norms, softmax, reductions and losses in float32; see
:class:`HalfPrecisionPolicy`), since the meta device has no autocast of its own.

A detector's RPN and RoI heads are data-dependent (NMS, sampling, RoIAlign): they run for
real on this CPU, on random features of the neck's output shapes at the real input, with
random boxes and masks (``--objects`` per image), and their saved tensors are counted the
same way; backbone and neck run on the meta device.

The input: the config's ``data_preprocessor.size`` (segmentation crops), else the largest
resize of the training pipeline (short and long side, COCO: 800 × 1333) padded to the
preprocessor's ``pad_size_divisor`` (800 × 1344); batch: ``train_dataloader.batch_size``.
"""
from __future__ import annotations

import contextlib
import copy
import json
import time
from typing import Any, Iterable, Iterator, Optional

import torch
import torch.nn.functional as F
from mmengine.config import Config
from torch.overrides import TorchFunctionMode

from vitdense.engine.wrappers.fsdp import SHARDED_BLOCKS
from vitdense.engine.hosts import build_model

from .complexity import load_config

GIB = 1 << 30
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


class SavedTensors:
    """Bytes of the distinct storages saved for backward inside the context, besides those
    of ``exclude`` (the parameters, counted on their own)."""

    def __init__(self, exclude: tuple[torch.Tensor, ...] = ()) -> None:
        self.excluded = {_storage_key(t) for t in exclude}
        self.storages: dict[int, int] = {}
        #: storage key of a float32 stand-in copy -> the half-precision tensor it stands in for
        self.stand_ins: dict[int, torch.Tensor] = {}

    def _count(self, tensor: torch.Tensor) -> None:
        key = _storage_key(tensor)
        if key not in self.excluded:
            self.storages[key] = tensor.untyped_storage().nbytes()

    def _pack(self, tensor: torch.Tensor) -> Any:
        original = self.stand_ins.get(_storage_key(tensor))
        if original is None:
            self._count(tensor)
            return tensor
        # the graph keeps the original, as a GPU's kernel would, not the float32 copy
        self._count(original)
        return original, tensor.size(), tensor.stride(), tensor.storage_offset()

    @staticmethod
    def _unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        original, size, stride, offset = packed  # the copy (or its view) made again
        return original.to(torch.float32).as_strided(size, stride, offset)

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

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


def largest_training_input(cfg: Config) -> tuple[int, int]:
    """(H, W) of the largest training batch (see the module doc)."""
    preprocessor = cfg.model.get('data_preprocessor', {})
    if preprocessor.get('size'):
        return tuple(preprocessor.size)
    device_augments = (cfg.get('data_preprocessor') or {}).get('augments', [])
    scales = list(_resize_scales([cfg.train_dataloader.dataset.get('pipeline', []),
                                  device_augments]))
    if not scales:
        raise KeyError('no data_preprocessor.size and no Resize scale in the training '
                       'pipeline: pass --shape H W')
    short = max(min(s) for s in scales)
    long = max(max(s) for s in scales)
    divisor = preprocessor.get('pad_size_divisor', 1)
    return -(-short // divisor) * divisor, -(-long // divisor) * divisor


def _resize_scales(steps: Any) -> Iterator[tuple[int, int]]:
    """Every (w, h) scale of the resize steps in a (nested) pipeline."""
    if isinstance(steps, (list, tuple)):
        for step in steps:
            yield from _resize_scales(step)
    elif isinstance(steps, dict):
        if steps.get('type') == 'RandomResizedCrop' and isinstance(steps.get('scale'), int):
            yield steps.scale, steps.scale  # a classifier's square crop
        elif 'Resize' in str(steps.get('type', '')):
            scales = steps.get('scales') or [steps.get('scale')]
            yield from (tuple(s) for s in scales if s is not None and not isinstance(s, int))
        yield from _resize_scales(steps.get('transforms', []))


def optimizer_states(cfg: Config) -> int:
    """Tensors the config's optimizer keeps per parameter (Adam family and LAMB: 2, SGD
    momentum: 1)."""
    name = cfg.optim_wrapper.optimizer.type
    if 'Adam' in name or 'Lamb' in name:
        return 2
    if name == 'SGD':
        return int(cfg.optim_wrapper.optimizer.get('momentum', 0) > 0)
    raise ValueError(f'optimizer {name!r}: state size unknown to this tool')


def uses_amp(cfg: Config) -> bool:
    return 'Amp' in cfg.optim_wrapper.get('type', 'OptimWrapper')


# ---------------------------------------------------------------------------- the model's step
def _det_samples(batch: int, shape: tuple[int, int], objects: int, num_classes: int) -> list:
    """Random boxes of a tenth to half the image with box-shaped masks (fixed seed)."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData

    generator = torch.Generator().manual_seed(0)
    height, width = shape
    samples = []
    for _ in range(batch):
        size = torch.tensor([width, height])
        corner = (torch.rand(objects, 2, generator=generator) * 0.5 * size).long()
        extent = ((0.1 + 0.4 * torch.rand(objects, 2, generator=generator)) * size).long()
        boxes = torch.cat([corner, torch.minimum(corner + extent, size)], dim=1)
        masks = torch.zeros(objects, height, width, dtype=torch.uint8)
        for mask, (x1, y1, x2, y2) in zip(masks, boxes.tolist()):
            mask[y1:y2, x1:x2] = 1
        sample = DetDataSample(metainfo=dict(img_shape=shape, pad_shape=shape,
                                             batch_input_shape=shape, ori_shape=shape,
                                             scale_factor=(1., 1.)))
        sample.gt_instances = InstanceData(
            bboxes=boxes.float(), masks=BitmapMasks(masks.numpy(), height, width),
            labels=torch.randint(0, num_classes, (objects,), generator=generator))
        samples.append(sample)
    return samples


def _seg_samples(batch: int, shape: tuple[int, int], num_classes: int, device: str) -> list:
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    samples = []
    for _ in range(batch):
        sample = SegDataSample(metainfo=dict(img_shape=shape, pad_shape=shape,
                                             ori_shape=shape))
        sample.gt_sem_seg = PixelData(data=torch.zeros(1, *shape, dtype=torch.long,
                                                       device=device))
        samples.append(sample)
    return samples


@contextlib.contextmanager
def _meta_friendly_seg_accuracy() -> Iterator[None]:
    """mmseg's decode heads log a pixel accuracy that indexes by a data-dependent mask;
    on the meta device it is replaced by a constant (it is not part of the graph)."""
    from mmseg.models.decode_heads import decode_head

    original = decode_head.accuracy
    decode_head.accuracy = lambda pred, target, *args, **kwargs: pred.new_zeros(())
    try:
        yield
    finally:
        decode_head.accuracy = original


def _precision(amp: bool, device: str, saved: SavedTensors) -> contextlib.AbstractContextManager:
    # real CPU tensors run the half-precision ops in bfloat16, which every CPU kernel takes
    # (RoIAlign, convolutions); it has float16's size
    return HalfPrecisionPolicy(HALF if device == 'meta' else torch.bfloat16, saved) if amp \
        else contextlib.nullcontext()


def count_backbone(backbone: torch.nn.Module, images: torch.Tensor, amp: bool = False) -> int:
    """Bytes a backbone's training forward on ``images`` saves for backward (the issue of
    high resolution: backbones alone, as in docs/memory.md)."""
    backbone.train()
    saved = SavedTensors(tuple(backbone.parameters()) + tuple(backbone.buffers()))
    with fused_attention_on_meta(), saved.recording(), _precision(amp, images.device.type, saved):
        backbone(images)
    return saved.bytes


def count_activations(model: torch.nn.Module, cfg: Config, batch: int,
                      shape: tuple[int, int], amp: bool, device: str = 'meta',
                      objects: int = 8) -> int:
    """Bytes saved for backward by one training forward of ``model`` (see the module doc).
    ``model`` is on ``device``; a detector's heads run on a CPU copy of their own."""
    model.train()
    params = tuple(model.parameters()) + tuple(model.buffers())
    saved = SavedTensors(params)
    images = torch.randn(batch, 3, *shape, device=device)
    with fused_attention_on_meta():
        if cfg.default_scope == 'mmseg':
            samples = _seg_samples(batch, shape, model.decode_head.num_classes, device)
            with _meta_friendly_seg_accuracy(), saved.recording(), _precision(amp, device, saved):
                model.loss(images, samples)
            return saved.bytes
        with saved.recording(), _precision(amp, device, saved):
            features = model.extract_feat(images)
            if cfg.default_scope == 'mmpretrain':
                model.head(features)
                return saved.bytes
        return saved.bytes + _count_detector_heads(model, cfg, features, batch, shape, amp,
                                                    objects)


#: the heads' count by (heads' config, feature shapes, batch, input, precision, objects):
#: the same for every backbone whose neck gives the same shapes
_HEADS_COUNTS: dict[str, int] = {}


def detector_classes(model: torch.nn.Module) -> int:
    """The classes of a two-stage detector's box head (a cascade's: its stages'); of
    Mask2Former's head, the thing classes (the objects' labels)."""
    if hasattr(model, 'panoptic_head'):
        return model.panoptic_head.num_things_classes
    box_head = model.roi_head.bbox_head
    return (box_head[-1] if isinstance(box_head, torch.nn.ModuleList) else box_head).num_classes


def _count_detector_heads(model: torch.nn.Module, cfg: Config, features: tuple, batch: int,
                          shape: tuple[int, int], amp: bool, objects: int) -> int:
    """The RPN and RoI heads' (Mask2Former's: its head's) saved bytes, run for real on the
    CPU on random features of the neck's output shapes (these features are counted here, as
    the heads save them)."""
    heads = {name: cfg.model[name].to_dict() for name in ('rpn_head', 'roi_head', 'panoptic_head')
             if name in cfg.model}
    key = json.dumps([heads, cfg.model.train_cfg.to_dict(), [list(f.shape) for f in features],
                      batch, list(shape), amp, objects], sort_keys=True, default=str)
    if key not in _HEADS_COUNTS:
        _HEADS_COUNTS[key] = _run_detector_heads(model, cfg, features, batch, shape, amp,
                                                 objects)
    return _HEADS_COUNTS[key]


def _run_detector_heads(model: torch.nn.Module, cfg: Config, features: tuple, batch: int,
                        shape: tuple[int, int], amp: bool, objects: int) -> int:
    heads = copy.copy(model)
    if any(p.is_meta for p in model.parameters()):
        heads = build_model(cfg, 'count', device='cpu').train()
    leaves = tuple(torch.randn(f.shape, dtype=torch.bfloat16 if amp else torch.float32,
                               requires_grad=True) for f in features)
    heads.extract_feat = lambda _: leaves
    saved = SavedTensors(tuple(heads.parameters()) + tuple(heads.buffers()))
    samples = _det_samples(batch, shape, objects, detector_classes(heads))
    with saved.recording(), _precision(amp, 'cpu', saved):
        heads.loss(torch.empty(batch, 3, *shape, device='meta'), samples)
    return saved.bytes


def sharded_bytes(tensors: Iterable[torch.Tensor], world_size: int) -> int:
    """Bytes one of ``world_size`` ranks keeps of ``tensors`` under FSDP2: each split along
    its first dimension, padded to a multiple of ``world_size``."""
    total = 0
    for tensor in tensors:
        rows = tensor.shape[0] if tensor.dim() else 1
        total += -(-rows // world_size) * (tensor.numel() // max(rows, 1)) * tensor.element_size()
    return total


def _fsdp_account(model: torch.nn.Module, optimizer_tensors: int, world_size: int) -> dict:
    """Per-GPU parameters, gradients and optimizer state under FSDP over ``world_size`` GPUs,
    and the transient full parameters and gradients of the gathered blocks: two blocks'
    parameters (the one computing and the next, prefetched) and one block's gradients
    before their reduce-scatter."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    blocks = [m for m in model.modules() if type(m).__name__ in SHARDED_BLOCKS]
    largest = max((sum(p.numel() * p.element_size() for p in block.parameters())
                   for block in blocks), default=0)
    grads = sharded_bytes(trainable, world_size)
    return dict(world_size=world_size, params=sharded_bytes(model.parameters(), world_size),
                grads=grads, optimizer=optimizer_tensors * grads, gathered=3 * largest)


def account(config: str, batch: Optional[int] = None, shape: Optional[tuple[int, int]] = None,
            amp: Optional[bool] = None, objects: int = 8,
            overrides: Optional[dict] = None, fsdp_world_size: int = 1) -> dict:
    """The memory account of ``config`` (``amp``: None for what the config enables), per
    GPU of a ``fsdp_world_size``-GPU FSDP run when above 1 (activations are not sharded)."""
    cfg = load_config(config)
    if overrides:
        cfg.merge_from_dict(overrides)
    batch = batch or cfg.train_dataloader.batch_size
    shape = tuple(shape) if shape else largest_training_input(cfg)
    model = build_model(cfg, 'count', device='meta')
    trainable = sum(p.numel() * p.element_size() for p in model.parameters()
                    if p.requires_grad)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    optimizer = optimizer_states(cfg) * trainable
    result = dict(config=config, batch=batch, shape=list(shape), params=params,
                  grads=trainable, optimizer=optimizer, config_amp=uses_amp(cfg),
                  with_cp=cfg.model.backbone.get('with_cp', False))
    states = params + trainable + optimizer
    if fsdp_world_size > 1:
        result['fsdp'] = fsdp = _fsdp_account(model, optimizer_states(cfg), fsdp_world_size)
        states = fsdp['params'] + fsdp['grads'] + fsdp['optimizer'] + fsdp['gathered']
    for precision, enabled in (('fp32', False), ('amp', True)):
        if amp is not None and amp != enabled:
            continue
        activations = count_activations(model, cfg, batch, shape, enabled, objects=objects)
        result[precision] = dict(activations=activations, peak=states + activations)
    return result


def time_step(config: str, batch: int, shape: tuple[int, int], repeats: int = 1,
              objects: int = 8, overrides: Optional[dict] = None) -> float:
    """Seconds of one real float32 training step on this machine's CPU (forward, losses,
    backward, AdamW), the least of ``repeats`` after one warm-up step."""
    cfg = load_config(config)
    if overrides:
        cfg.merge_from_dict(overrides)
    model = build_model(cfg, 'count', device='cpu').train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    images = torch.randn(batch, 3, *shape)
    if cfg.default_scope == 'mmseg':
        samples = _seg_samples(batch, shape, model.decode_head.num_classes, 'cpu')
    else:
        samples = _det_samples(batch, shape, objects, detector_classes(model))

    def step() -> None:
        optimizer.zero_grad()
        sum(_flat_losses(model.loss(images, samples))).backward()
        optimizer.step()

    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return min(times[1:])


def _flat_losses(losses: dict) -> list[torch.Tensor]:
    out = []
    for name, value in losses.items():
        if 'loss' not in name:
            continue
        out.extend(value if isinstance(value, (list, tuple)) else [value])
    return out
