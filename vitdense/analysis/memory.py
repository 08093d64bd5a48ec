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

A detector's RPN and RoI heads are data-dependent (NMS, sampling, RoIAlign), and so is
Mask2Former's head (Hungarian matching, point sampling; mmdet's and mmseg's): they run for
real on this CPU, on random features of the neck's output shapes at the real input, with
random boxes and masks (``--objects`` per image; a segmentor's: label maps of as many random
regions), and their saved tensors are counted the same way, mmcv's deformable attention as
its GPU kernel keeps it (values, sampling locations, attention weights; not the sampled maps
of its CPU path), without keeping what they count (``SavedTensors(keep=False)``: the CPU
holds one step's live tensors, not its saved ones); backbone and neck run on the meta
device.

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
from mmengine.config import Config
from mmengine.registry import MODELS, DefaultScope

from vitdense.engine.wrappers.fsdp import SHARDED_BLOCKS
from vitdense.model_factory import build_model

from .complexity import load_config
from .saved_tensors import (HALF, HalfPrecisionPolicy, SavedTensors, deformable_attention_as_on_gpu,
                            fused_attention_on_meta)

GIB = 1 << 30


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
def _random_boxes(objects: int, shape: tuple[int, int],
                  generator: torch.Generator) -> torch.Tensor:
    """``objects`` (x1, y1, x2, y2) boxes of a tenth to half the image."""
    size = torch.tensor([shape[1], shape[0]])
    corner = (torch.rand(objects, 2, generator=generator) * 0.5 * size).long()
    extent = ((0.1 + 0.4 * torch.rand(objects, 2, generator=generator)) * size).long()
    return torch.cat([corner, torch.minimum(corner + extent, size)], dim=1)


def _det_samples(batch: int, shape: tuple[int, int], objects: int, num_classes: int) -> list:
    """Random boxes of a tenth to half the image with box-shaped masks (fixed seed)."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData

    generator = torch.Generator().manual_seed(0)
    height, width = shape
    samples = []
    for _ in range(batch):
        boxes = _random_boxes(objects, shape, generator)
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


def _seg_samples(batch: int, shape: tuple[int, int], num_classes: int, device: str,
                 objects: int = 0) -> list:
    """Label maps of class 0, with ``objects`` random rectangles of random classes painted
    over it (fixed seed): the regions a query head matches its queries to."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    generator = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(batch):
        sample = SegDataSample(metainfo=dict(img_shape=shape, pad_shape=shape,
                                             ori_shape=shape))
        labels = torch.zeros(1, *shape, dtype=torch.long)
        for box in _random_boxes(objects, shape, generator).tolist():
            x1, y1, x2, y2 = box
            labels[:, y1:y2, x1:x2] = int(torch.randint(1, num_classes, (), generator=generator))
        sample.gt_sem_seg = PixelData(data=labels.to(device))
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
        if cfg.default_scope == 'mmseg' and not has_query_head(model):
            samples = _seg_samples(batch, shape, model.decode_head.num_classes, device)
            with _meta_friendly_seg_accuracy(), saved.recording(), _precision(amp, device, saved):
                model.loss(images, samples)
            return saved.bytes
        with saved.recording(), _precision(amp, device, saved):
            features = model.extract_feat(images)
            if cfg.default_scope == 'mmpretrain':
                model.head(features)
                return saved.bytes
        return saved.bytes + _count_heads(model, cfg, features, batch, shape, amp, objects)


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


def has_query_head(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a segmentor with Mask2Former's head (mmseg's): its matching and
    point sampling are data-dependent, so it runs on the CPU as a detector's heads do."""
    return hasattr(getattr(model, 'decode_head', None), 'pixel_decoder')


def _count_heads(model: torch.nn.Module, cfg: Config, features: tuple, batch: int,
                 shape: tuple[int, int], amp: bool, objects: int) -> int:
    """The RPN and RoI heads' (Mask2Former's: its head's) saved bytes, run for real on the
    CPU on random features of the neck's output shapes (these features are counted here, as
    the heads save them)."""
    heads = {name: cfg.model[name].to_dict() for name in HEADS if name in cfg.model}
    key = json.dumps([heads, cfg.model.train_cfg.to_dict(), [list(f.shape) for f in features],
                      batch, list(shape), amp, objects], sort_keys=True, default=str)
    if key not in _HEADS_COUNTS:
        leaves = tuple(torch.randn(f.shape, dtype=torch.bfloat16 if amp else torch.float32,
                                   requires_grad=True) for f in features)
        run = _run_query_head if cfg.default_scope == 'mmseg' else _run_detector_heads
        with deformable_attention_as_on_gpu():
            _HEADS_COUNTS[key] = run(model, cfg, leaves, shape, amp, objects)
    return _HEADS_COUNTS[key]


#: the config's heads that run on the CPU (the key of their count)
HEADS = ('rpn_head', 'roi_head', 'panoptic_head', 'decode_head')


def _run_detector_heads(model: torch.nn.Module, cfg: Config, leaves: tuple,
                        shape: tuple[int, int], amp: bool, objects: int) -> int:
    heads = copy.copy(model)
    if any(p.is_meta for p in model.parameters()):
        heads = build_model(cfg, 'count', device='cpu').train()
    heads.extract_feat = lambda _: leaves
    saved = SavedTensors(tuple(heads.parameters()) + tuple(heads.buffers()), keep=False)
    samples = _det_samples(len(leaves[0]), shape, objects, detector_classes(heads))
    with saved.recording(), _precision(amp, 'cpu', saved):
        heads.loss(torch.empty(len(leaves[0]), 3, *shape, device='meta'), samples)
    return saved.bytes


def _run_query_head(model: torch.nn.Module, cfg: Config, leaves: tuple,
                    shape: tuple[int, int], amp: bool, objects: int) -> int:
    """mmseg's Mask2Former head alone (built on the CPU from its config where ``model`` is on
    the meta device), its loss on label maps of ``objects`` regions per image."""
    head = model.decode_head
    if any(p.is_meta for p in head.parameters()):
        with DefaultScope.overwrite_default_scope('mmseg'), torch.device('cpu'):
            head = MODELS.build(cfg.model.decode_head)
    head.train()
    saved = SavedTensors(tuple(head.parameters()) + tuple(head.buffers()), keep=False)
    samples = _seg_samples(len(leaves[0]), shape, head.num_classes, 'cpu', objects)
    with saved.recording(), _precision(amp, 'cpu', saved):
        head.loss(leaves, samples, cfg.model.train_cfg)
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
                  with_cp=cfg.model.backbone.get('with_cp', False),
                  backbone_grads=sum(p.numel() * p.element_size()
                                     for p in model.backbone.parameters() if p.requires_grad),
                  checkpoint=trainable + optimizer + _buffer_bytes(model))
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


def _buffer_bytes(model: torch.nn.Module) -> int:
    """Bytes of the buffers a state dict holds (the persistent ones)."""
    params = {name for name, _ in model.named_parameters()}
    return sum(t.numel() * t.element_size() for name, t in model.state_dict().items()
               if name not in params)


#: the LoRA a full recipe is compared with when it names none (the large LoRA recipes')
LORA = dict(type='LoRA', r=16, alpha=32, targets=('qkv', 'proj', 'fc1', 'fc2'))


def peft_key(cfg: Config) -> str:
    """The config key of the backbone's ``peft`` option: ``model.backbone.peft``, or the
    trunk's (``model.backbone.backbone.peft``) in ViT-Adapter's layout."""
    backbone = cfg.model.backbone
    return 'model.backbone.backbone.peft' if 'backbone' in backbone else 'model.backbone.peft'


def lora_and_full(config: str, batch: int = 2, amp: Optional[bool] = None,
                  objects: int = 8) -> dict:
    """The accounts of ``config`` with LoRA (its own ``peft``, else :data:`LORA`) and with
    full fine-tuning (no ``peft``), at ``batch`` and the config's precision (``amp``: None),
    and LoRA's share of full fine-tuning's gradients + optimizer state (the whole model's
    and the backbone's) and of the trainer's checkpoint (trained parameters, their
    optimizer state and the buffers: what vitdense.PeftCheckpointHook keeps)."""
    cfg = load_config(config)
    key = peft_key(cfg)
    backbone = cfg.model.backbone
    lora = (backbone.backbone if 'backbone' in backbone else backbone).get('peft') or LORA
    amp = uses_amp(cfg) if amp is None else amp
    lora_account, full = (account(config, batch, amp=amp, objects=objects,
                                  overrides={key: peft}) for peft in (lora, None))
    trained = {name: result['grads'] + result['optimizer']
               for name, result in (('lora', lora_account), ('full', full))}
    return dict(config=config, precision='amp' if amp else 'fp32', lora=lora_account,
                full=full, trained_share=trained['lora'] / trained['full'],
                backbone_trained_share=lora_account['backbone_grads'] / full['backbone_grads'],
                checkpoint_share=lora_account['checkpoint'] / full['checkpoint'])


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
