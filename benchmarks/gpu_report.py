"""The GPU report: how much of the machine our training steps use, one case at a time.

    python -m benchmarks.gpu_report --out work_dirs/gpu_report.jsonl [--cases PATTERN ...]
        [--no-compile] [--budget-s 300] [--case-limit-s 150] [--list] [--docs PAGE]

Cases, in this order (``--list`` prints them with what ``--out`` holds of each):

- ``step ...``: one training step of mmdet's ResNet-50 Mask R-CNN (the anchor, in float16
  mixed precision as our detectors train), then of the Mask R-CNN and UperNet configs of
  ViT-B, CaiT-S24, CaiT-XXS24, XCiT-S12 and ConViT-B at the configs' batch and largest
  training input (2 × 800 × 1344, 2 × 512 × 512), with the config's own optimizer wrapper:
  step time, real peak memory beside the memory account (``vitdense.analysis.memory``);
- ``stages ...``: the ResNet-50 and ViT-B Mask R-CNN steps cut into backbone, neck, heads
  and optimizer, each timed alone beside the whole step;
- ``talking-heads PATH GRID``: one CaiT-S24 attention layer's training step on each path
  of ``talking_heads.KERNELS`` that runs on the device, and (``sdpa``) the same layer without
  talking heads, at COCO's and ADE20k's token grids, with whether two backward passes give
  bit-identical gradients (``--talking-heads PATH`` forces a path in the step and backbone
  cases too);
- ``device-augment vs vit-s step``: the DeiT recipe's augmentation on the device
  (``DeviceAugmentPreprocessor``, on decoded images and decoding the JPEG bytes itself) on a
  batch of 128 ImageNet-sized images, against one ViT-S/16 training step on that batch
  (``benchmarks/benchmark_data_pipeline.py device``): its share of the step, whose floor is 5 %;
- ``backbone NAME cls|dense eager|compiled``: the classifier's backbone (class token out)
  training step at 224² batch 64 (bf16 autocast, ours against timm's on the same weights)
  and the dense backbone (columnar block outputs) alone at 2 × 800 × 1344 (fp16 autocast);
  compiled cases time the first call (the compile) and the steady step.

``--cases floors`` (:data:`CASE_SETS`) selects the ~5-minute set that the GPU floors are
read from.

Every step record carries ``model_flops`` (the architecture's arithmetic, talking heads
written out, the position table's resampling to the input's grid left out, as the papers
and the model index count it; counted on the meta device) and
``executed_flops`` (what the kernels that ran execute: CaiT's fold does heads × the
attention FLOPs, recomputed in backward), each as a share of the matrix-product rate of the
step's compute type measured at the start of the run; and the attention kernel each
``scaled_dot_product_attention`` shape took. Every case runs with SDPA restricted to its
fused kernels (:data:`FUSED_BACKENDS`), so a shape that would silently fall back to the
math kernel fails its case instead.

Each record is one JSON line appended to ``--out`` (flushed and fsynced) as soon as it is
measured; a run skips the cases ``--out`` already holds (``--retry-errors``: except those
that failed), starts no case after ``--budget-s`` and stops any case at ``--case-limit-s``
(recorded as an error), so that a 10-minute call always returns what it measured and
the next call goes on. ``--docs`` writes the Markdown page from all of ``--out``'s records
(``--render`` only that). Without a GPU the same code runs small (one tiny arch per family,
tiny inputs, the demo configs, one repetition, the ``aot_eager`` backend): a check that the
report works, not a measurement. docs/gpu_report.md says how to run it on a GPU machine without network.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import fnmatch
import glob
import json
import logging
import os
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.benchmark_lib import (OURS, BackboneSpec, build_backbone_pair, count_flops,
                                      environment, first_call_s, flatten_outputs, make_step,
                                      synchronizer, time_interleaved)
from vitdense.analysis.complexity import position_tables
from vitdense.engine.compile import compile_function
from vitdense.models.layers import talking_heads

HEADLINE_MODELS = ('vit_base_patch16_224', 'cait_s24_224', 'cait_xxs24_224',
                   'xcit_small_12_p16_224', 'convit_base')
DENSE_BACKBONES = ('vit/{}_vit-b-p16', 'cait/{}_cait-s24-p16', 'cait/{}_cait-xxs24-p16',
                   'xcit/{}_xcit-s12-p16', 'convit/{}_convit-b-p16')
DENSE_CONFIGS = tuple(f'configs/{b.format("mask-rcnn")}_fpn_3x_coco.py' for b in DENSE_BACKBONES) \
    + tuple(f'configs/{b.format("upernet")}_8xb2-160k_ade20k-512x512.py' for b in DENSE_BACKBONES)
SMALL_DENSE_CONFIGS = ('configs/cait/mask-rcnn_cait-d6-p8_fpn_demo-coco.py',
                       'configs/cait/upernet_cait-d6-p8_demo-ade.py')
ANCHOR = 'mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
TINY_ARCH = dict(embed_dims=32, num_layers=4, num_heads=2)  # 4 blocks: the pyramid's 4 outputs
#: the talking-heads layer timed per path: CaiT-S24's (8 heads of 48)
LAYER_WIDTH, LAYER_HEADS = 384, 8
#: the talking-heads cases' reference: the same layer without talking heads (SDPA)
PLAIN_SDPA = 'sdpa'
#: SDPA's fused kernels; the math kernel is left out so that falling back to it raises
FUSED_BACKENDS = ('CUDNN_ATTENTION', 'FLASH_ATTENTION', 'EFFICIENT_ATTENTION')
#: the aten operator of each SDPA kernel, by the name records give it
SDPA_KERNELS = {'_scaled_dot_product_cudnn_attention': 'cudnn',
                '_scaled_dot_product_flash_attention': 'flash',
                '_scaled_dot_product_efficient_attention': 'efficient',
                '_scaled_dot_product_flash_attention_for_cpu': 'flash (CPU)',
                '_scaled_dot_product_fused_attention_overrideable': 'overrideable'}

Measure = Callable[[dict], dict]  # the matmul rates by dtype name -> the case's record


@dataclass(frozen=True)
class Setting:
    """One size of the run: how every case is sized and compiled."""

    device: str
    cls_batch: int
    cls_size: int
    dense_batch: int
    dense_size: tuple[int, int]
    backend: str
    repeats: int
    warmup: int  # untimed steps before the samples (at least 1)
    gemm_size: int
    dense_configs: tuple[str, ...]
    dense_shape: Optional[tuple[int, int]]  # None: the config's own input
    layer_grids: tuple[tuple[int, int], ...]  # talking-heads layer: token grids, batch 2
    budget_s: float  # the defaults of --budget-s and --case-limit-s
    case_limit_s: float
    talking_heads_path: Optional[str] = None  # forced in the step and backbone cases
    augment_batch: int = 128  # the device augmentation case: images, rounds, their size
    augment_rounds: int = 10
    augment_image_size: Optional[tuple[int, int]] = None  # None: ImageNet's mix of sizes
    #: the Mask R-CNN configs whose steps are cut into stages (:data:`ANCHOR`: mmdet's R50)
    stage_configs: tuple[str, ...] = (ANCHOR, 'configs/vit/mask-rcnn_vit-b-p16_fpn_3x_coco.py')


GPU = Setting('cuda', 64, 224, 2, (800, 1344), 'inductor', 5, 2, 8192, DENSE_CONFIGS, None,
              ((50, 84), (32, 32)), 300., 150.)
CPU = Setting('cpu', 1, 32, 1, (32, 64), 'aot_eager', 1, 1, 256, SMALL_DENSE_CONFIGS, (64, 96),
              ((4, 6),), float('inf'), 1800., augment_batch=2, augment_rounds=1,
              augment_image_size=(48, 64),
              stage_configs=('configs/vit/mask-rcnn_vit-d6-p8_fpn_demo-coco.py',))
#: named sets of cases ``--cases`` takes beside patterns. ``floors``: what the GPU floors of
#: the talking-heads kernel and the detector step's overheads are read from, in about
#: 5 minutes on a fresh machine (docs/gpu_report.md): one CaiT-S24 layer on the Triton
#: kernel beside plain SDPA at COCO's grid, the R50 anchor and the ViT-B, CaiT-S24 and
#: CaiT-XXS24 Mask R-CNN and UperNet steps, the stages of the ViT-B and R50 steps and ViT-B's
#: classifier step beside timm's
CASE_SETS = {'floors': (
    'talking-heads triton 50x84', f'talking-heads {PLAIN_SDPA} 50x84',
    'step mask-rcnn_r50_fpn_1x_coco+amp', 'step mask-rcnn_vit-b-p16_fpn_3x_coco',
    'step mask-rcnn_cait-s24-p16_fpn_3x_coco', 'step mask-rcnn_cait-xxs24-p16_fpn_3x_coco',
    'step upernet_vit-b-p16_*', 'step upernet_cait-s24-p16_*',
    'step upernet_cait-xxs24-p16_*', 'stages *', 'backbone vit_base_patch16_224 cls eager')}


def half_types(setting: Setting) -> dict[str, torch.dtype]:
    """The autocast types of the two backbone tasks (on CPU both bf16: no fp16 autocast)."""
    if setting.device == 'cpu':
        return dict(cls=torch.bfloat16, dense=torch.bfloat16)
    return dict(cls=torch.bfloat16, dense=torch.float16)


# ---------------------------------------------------------------------- records
def append_record(path: Path, record: dict) -> None:
    """One JSON line appended to ``path`` and on disk before this returns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, 'a') as file:
        file.write(json.dumps(record, default=str) + '\n')
        file.flush()
        os.fsync(file.fileno())


def read_records(path: Path) -> list[dict]:
    """The records of ``path`` (none if it does not exist); a last line cut short by a
    killed run is left out."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            records.append(json.loads(line))
    return records


def recorded_cases(path: Path) -> dict[str, dict]:
    """The last record of each case ``path`` holds, by case name."""
    return {r['case']: r for r in read_records(path) if r.get('record') == 'case'}


# ---------------------------------------------------------------------- attention kernels
@contextlib.contextmanager
def fused_attention() -> Iterator[None]:
    """Within: SDPA may run only its fused kernels (:data:`FUSED_BACKENDS`, in torch's own
    order of preference), so a shape none of them takes raises instead of running the math
    kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([getattr(SDPBackend, name) for name in FUSED_BACKENDS]):
        yield


class _KernelSeen(TorchDispatchMode):
    """The SDPA kernel operators dispatched inside, with their query / key shapes and type."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kernel = SDPA_KERNELS.get(func.__name__.split('.')[0])
        if kernel is not None:
            self.calls.append(dict(query=list(args[0].shape), key=list(args[1].shape),
                                   dtype=dtype_name(args[0].dtype), kernel=kernel))
        return func(*args, **(kwargs or {}))


class AttentionKernels(TorchFunctionMode):
    """Records the kernel each ``scaled_dot_product_attention`` call inside runs ('math'
    where no fused kernel ran); :meth:`summary` lists each distinct shape once."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        with _KernelSeen() as seen:
            out = func(*args, **kwargs)
        self.calls += seen.calls or [dict(query=list(args[0].shape), key=list(args[1].shape),
                                          dtype=dtype_name(args[0].dtype), kernel='math')]
        return out

    def summary(self) -> list[dict]:
        counts: dict[str, dict] = {}
        for call in self.calls:
            entry = counts.setdefault(json.dumps(call, sort_keys=True), dict(call, calls=0))
            entry['calls'] += 1
        return list(counts.values())


def attention_setup() -> dict:
    """What decides the SDPA kernel: cuDNN's version and torch's order of preference."""
    from torch.nn.attention import SDPBackend
    names = {int(getattr(SDPBackend, name)): name for name in dir(SDPBackend)
             if name.isupper() and name != 'ERROR'}
    return dict(cudnn=torch.backends.cudnn.version(),
                sdpa_priority=[names.get(int(i), str(i)) for i in
                               torch._C._get_sdp_priority_order()])


# ---------------------------------------------------------------------- FLOPs
def training_step(module: nn.Module, inputs: torch.Tensor,
                  dtype: Optional[torch.dtype]) -> Callable[[], None]:
    """Forward (under autocast to ``dtype``), a scalar loss over every output, backward;
    gradients dropped after, and nothing else about ``module`` changed (frozen parameters
    stay frozen, as in the detector that holds it)."""
    precision = contextlib.nullcontext() if dtype is None else \
        torch.autocast(inputs.device.type, dtype=dtype)

    def step() -> None:
        with precision:
            outputs = flatten_outputs(module(inputs))
        sum(out.float().mean() for out in outputs).backward()
        module.zero_grad(set_to_none=True)
    return step


def architecture_flops(module: nn.Module, inputs: torch.Tensor) -> int:
    """FLOPs of :func:`training_step` of ``module`` as the architecture defines it and the
    model index counts it: a copy on the meta device (shapes only, so written-out maps cost
    no memory), talking heads written out, the position tables' resampling left out."""
    meta = copy.deepcopy(module).to('meta')
    meta_inputs = torch.empty(inputs.shape, device='meta', requires_grad=inputs.requires_grad)
    with talking_heads.forced_path(meta, 'maps'):
        return count_flops(training_step(meta, meta_inputs, None), position_tables(meta))


class UncountedOps(TorchDispatchMode):
    """The operators dispatched inside that are not torch's own (custom kernels such as
    talking heads' CPU operator, torchvision's RoIAlign): FLOP counting has no formula for
    them, so executed FLOPs leave them out."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace not in ('aten', 'prim', 'prims', 'profiler'):
            self.names.add(func._schema.name)
        return func(*args, **(kwargs or {}))


def inspect_step(step: Callable[[], None]) -> dict:
    """One call of ``step``: the FLOPs it executes, the attention kernels it runs and the
    operators left out of the count."""
    with AttentionKernels() as kernels, UncountedOps() as uncounted:
        flops = count_flops(step)
    return dict(executed_flops=flops, attention=kernels.summary(),
                uncounted_ops=sorted(uncounted.names))


def flop_fields(model_flops: int, inspected: dict, seconds: float, rate: float) -> dict:
    """Both FLOP counts (with the rest of :func:`inspect_step`'s findings) and their shares
    of the matmul ``rate`` at ``seconds`` per step."""
    return dict(inspected, model_flops=model_flops, model_share=model_flops / seconds / rate,
                executed_share=inspected['executed_flops'] / seconds / rate)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).split('.')[-1]


def matmul_rates(setting: Setting) -> dict[str, float]:
    """FLOP/s of an n × n matmul in each compute type (2 FLOPs per multiply-add)."""
    n, rates = setting.gemm_size, {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        a, b = (torch.randn(n, n, device=setting.device, dtype=dtype) for _ in range(2))
        seconds = min(time_interleaved({'mm': lambda: a @ b}, warmup=setting.warmup,
                                       repeats=setting.repeats,
                                       sync=synchronizer(setting.device))['mm'])
        rates[dtype_name(dtype)] = 2 * n ** 3 / seconds
    return rates


# ---------------------------------------------------------------------- cases
def backbone_specs(names: tuple[str, ...], setting: Setting) -> list[BackboneSpec]:
    """Our spec of each timm name; on CPU every family at :data:`TINY_ARCH` without timm."""
    from benchmarks.benchmark_lib import backbone_specs as all_specs
    from vitdense.models import backbone_families
    if setting.device == 'cpu':
        return [BackboneSpec(f'tiny_{family}', family, dict(  # type: ignore[arg-type]
            TINY_ARCH, **({'num_local_layers': 1} if family == 'convit' else {})))
            for family in sorted(backbone_families())]
    specs = all_specs()
    unknown = [name for name in names if name not in specs]
    if unknown:
        raise SystemExit(f'unknown models {unknown}; choose from {sorted(specs)}')
    return [specs[name] for name in names]


def forcing(model: nn.Module, setting: Setting) -> contextlib.AbstractContextManager:
    """Within: ``model``'s talking heads take the setting's path, if it forces one."""
    if setting.talking_heads_path is None:
        return contextlib.nullcontext()
    return talking_heads.forced_path(model, setting.talking_heads_path)


def measure_backbone(spec: BackboneSpec, task: str, compiled: bool, setting: Setting,
                     rates: dict[str, float]) -> dict:
    """Training steps of ours (and timm's for the 224² task), eager or compiled: 'cls' the
    classifier's backbone (its class token out, beside timm's pooled features), 'dense' the
    columnar block outputs; ``outputs``: the shapes ours returns."""
    device, dtype = setting.device, half_types(setting)[task]
    if task == 'cls':
        size, batch = setting.cls_size, setting.cls_batch
        models = build_backbone_pair(spec, 'cls', size)
    else:
        size, batch = setting.dense_size, setting.dense_batch
        models = {OURS: build_backbone_pair(replace(spec, timm_name=None), 'dense', size)[OURS]}
    images = torch.randn(batch, 3, *((size, size) if isinstance(size, int) else size),
                         device=device)
    with forcing(models[OURS], setting):
        model_flops = architecture_flops(models[OURS], images)
        with torch.no_grad():
            shapes = [list(out.shape) for out in flatten_outputs(models[OURS](images))]
        record = dict(kind='backbone', model=spec.name, task=task, batch=batch,
                      input=list(images.shape[2:]), outputs=shapes, dtype=dtype_name(dtype),
                      compiled=compiled)
        steps, inspected = {}, {}
        for name, model in models.items():
            model.to(device).train()
            steps[name] = make_step(model, images, 'train', dtype=dtype)
            inspected[name] = inspect_step(steps[name])
            if compiled:
                compiled_model = compile_function(model, setting.backend)
                steps[name] = make_step(compiled_model, images, 'train', dtype=dtype)
                record[f'{name} first_call_s'] = first_call_s(steps[name], device)
        samples = time_interleaved(steps, warmup=setting.warmup, repeats=setting.repeats,
                                   sync=synchronizer(device))
        for name, times in samples.items():
            seconds = sorted(times)[len(times) // 2]
            record[name] = dict(ms=1e3 * seconds, **flop_fields(
                model_flops, inspected[name], seconds, rates[dtype_name(dtype)]))
    return record


def measure_talking_heads(path: str, grid: tuple[int, int], setting: Setting,
                          rates: dict[str, float]) -> dict:
    """One talking-heads attention layer's training step (bf16 autocast, batch 2) on
    ``path``, or (:data:`PLAIN_SDPA`) the same layer without talking heads, SDPA on the same
    heads and widths: time, FLOPs, whether two backward passes give bit-identical
    gradients and, on CUDA, peak memory above the inputs."""
    from vitdense.models.layers.attention import MultiheadSelfAttention
    device, dtype = setting.device, torch.bfloat16
    torch.manual_seed(0)
    layer = (MultiheadSelfAttention(LAYER_WIDTH, LAYER_HEADS) if path == PLAIN_SDPA else
             MultiheadSelfAttention(LAYER_WIDTH, LAYER_HEADS, talking_heads=True,
                                    talking_heads_path=path)).to(device)
    tokens = torch.randn(2, grid[0] * grid[1], LAYER_WIDTH, device=device, requires_grad=True)
    module = OnGrid(layer, grid)
    step = training_step(module, tokens, dtype)
    identical = backward_is_deterministic(module, tokens, dtype)
    inspected = inspect_step(step)
    model_flops = architecture_flops(module, tokens)
    cuda = device == 'cuda'
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    seconds = min(time_interleaved({path: step}, warmup=setting.warmup,
                                   repeats=setting.repeats, sync=synchronizer(device))[path])
    record = dict(kind='talking-heads', path=path, batch=2, grid=list(grid),
                  width=LAYER_WIDTH, heads=LAYER_HEADS, dtype=dtype_name(dtype),
                  ms=1e3 * seconds, backward_bit_identical=identical,
                  **flop_fields(model_flops, inspected, seconds, rates[dtype_name(dtype)]))
    if cuda:
        record['memory_gib'] = (torch.cuda.max_memory_allocated() - base) / 2 ** 30
    return record


def backward_is_deterministic(module: nn.Module, inputs: torch.Tensor,
                              dtype: torch.dtype) -> bool:
    """Whether two forward + backward passes of ``module`` on ``inputs`` (autocast to
    ``dtype``) give bit-identical gradients of the inputs and of every parameter."""
    grads = []
    for _ in range(2):
        inputs.grad = None
        module.zero_grad(set_to_none=True)
        with torch.autocast(inputs.device.type, dtype=dtype):
            outputs = flatten_outputs(module(inputs))
        sum(out.float().mean() for out in outputs).backward()
        grads.append([inputs.grad] + [p.grad for p in module.parameters()])
    inputs.grad = None
    module.zero_grad(set_to_none=True)
    return all(a is None and b is None or a is not None and b is not None and torch.equal(a, b)
               for a, b in zip(*grads))


class OnGrid(nn.Module):
    """An attention layer applied to tokens of one grid: a module of one input."""

    def __init__(self, layer: nn.Module, grid: tuple[int, int]) -> None:
        super().__init__()
        self.layer, self.grid = layer, grid

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.layer(tokens, self.grid)


@dataclass
class TrainingStep:
    """A config's model, its own optimizer wrapper and one batch of random inputs at the
    setting's size: what :func:`measure_step` and :func:`measure_stages` time."""

    cfg: Any
    model: nn.Module
    wrapper: Any
    images: torch.Tensor
    samples: list
    amp: bool
    compute: torch.dtype

    def step(self) -> None:
        """One training step as mmengine's loop makes it."""
        with self.wrapper.optim_context(self.model):
            losses = self.model.loss(self.images, self.samples)
        parsed, _ = self.model.parse_losses(losses)
        self.wrapper.update_params(parsed)


def build_training_step(config: str, setting: Setting, amp: Optional[bool] = None
                        ) -> TrainingStep:
    """``config``'s model and optimizer wrapper (``amp``: made float16 mixed precision, or
    float32) on the setting's device, with a batch at the setting's size (or the config's
    largest training input)."""
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import DefaultScope

    from vitdense.analysis import memory
    from vitdense.model_factory import build_model

    cfg = memory.load_config(config)
    if amp is not None and amp != memory.uses_amp(cfg):
        cfg.optim_wrapper = dict(type='AmpOptimWrapper' if amp else 'OptimWrapper',
                                 optimizer=cfg.optim_wrapper.optimizer)
    amp = memory.uses_amp(cfg)
    shape = setting.dense_shape or memory.largest_training_input(cfg)
    batch, device = cfg.train_dataloader.batch_size, setting.device
    model = build_model(cfg, 'train', device=device).train()
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    compute = (getattr(wrapper, 'cast_dtype', None)
               or (torch.float16 if device == 'cuda' else torch.bfloat16)) if amp else \
        torch.float32
    images = torch.randn(batch, 3, *shape, device=device)
    if cfg.default_scope == 'mmseg':
        samples = memory._seg_samples(batch, shape, model.decode_head.num_classes, device)
    else:
        samples = [s.to(device) for s in memory._det_samples(
            batch, shape, 8, model.roi_head.bbox_head.num_classes)]
    return TrainingStep(cfg, model, wrapper, images, samples, amp, compute)


def measure_step(config: str, setting: Setting, rates: dict[str, float],
                 amp: Optional[bool] = None) -> dict:
    """One training step of ``config`` with its own optimizer wrapper (``amp``: made float16
    mixed precision, or float32): time, FLOPs, attention kernels, real peak memory (CUDA)
    beside the memory account of the same input."""
    from vitdense.analysis import memory

    cuda = setting.device == 'cuda'
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    built = build_training_step(config, setting, amp)
    model, images, batch = built.model, built.images, built.images.shape[0]
    shape = tuple(images.shape[2:])
    with forcing(model, setting):
        built.step()
        inspected = inspect_step(built.step)
        # the backbone is the only part whose executed arithmetic differs from the model's
        backbone_step = training_step(model.backbone, images,
                                      built.compute if built.amp else None)
        model_flops = inspected['executed_flops'] - count_flops(backbone_step) + \
            architecture_flops(model.backbone, images)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        seconds = min(time_interleaved({'step': built.step}, warmup=1, repeats=setting.repeats,
                                       sync=synchronizer(setting.device))['step'])
    amp = built.amp
    predicted = memory.account(config, batch=batch, shape=shape)['amp' if amp else 'fp32']['peak']
    record = dict(kind='step', config=os.path.basename(config), batch=batch, input=list(shape),
                  amp=amp, dtype=dtype_name(built.compute),
                  optim_wrapper=type(built.wrapper).__name__,
                  param_groups=len(built.wrapper.optimizer.param_groups),
                  ms=1e3 * seconds, account_gib=predicted / 2 ** 30,
                  **flop_fields(model_flops, inspected, seconds, rates[dtype_name(built.compute)]))
    if cuda:
        real = torch.cuda.max_memory_allocated() - base
        record.update(real_gib=real / 2 ** 30, real_over_account=real / predicted)
    return record


def _backward_through(outputs: Any) -> None:
    """Backward from every output tensor with a gradient of ones (the cost of backward does
    not depend on the gradient's values)."""
    tensors = [out for out in flatten_outputs(outputs) if out.requires_grad]
    torch.autograd.backward(tensors, [torch.ones_like(out) for out in tensors])


def _detached(outputs: Any) -> tuple[torch.Tensor, ...]:
    return tuple(out.detach().requires_grad_() for out in flatten_outputs(outputs))


def measure_stages(config: str, setting: Setting, rates: dict[str, float],
                   amp: Optional[bool] = None) -> dict:
    """A Mask R-CNN training step cut into its stages, each timed alone beside the whole
    step, interleaved: the backbone's forward and backward, the neck's (on the backbone's
    outputs, detached), the heads' (RPN and RoI heads: the losses from the neck's outputs,
    detached, and their backward through the loss scaler) and the optimizer wrapper's
    step (on the gradients a whole step leaves). Their sum against the step's time says
    what the cut leaves out (the parts' overlap on the device, the losses' parsing)."""
    built = build_training_step(config, setting, amp)
    model, wrapper, images = built.model, built.wrapper, built.images
    with forcing(model, setting):
        built.step()
        with wrapper.optim_context(model):
            features = _detached(model.backbone(images))
            neck_outputs = _detached(model.neck(features))

        def backbone() -> None:
            model.zero_grad(set_to_none=True)  # as after a step: gradients written, not added
            with wrapper.optim_context(model):
                outputs = model.backbone(images)
            _backward_through(outputs)

        def neck() -> None:
            model.zero_grad(set_to_none=True)
            for feature in features:
                feature.grad = None
            with wrapper.optim_context(model):
                outputs = model.neck(features)
            _backward_through(outputs)

        def heads() -> None:
            model.zero_grad(set_to_none=True)
            for feature in neck_outputs:
                feature.grad = None
            model.extract_feat = lambda inputs: neck_outputs
            try:
                with wrapper.optim_context(model):
                    losses = model.loss(images, built.samples)
                parsed, _ = model.parse_losses(losses)
                wrapper.backward(parsed)
            finally:
                del model.extract_feat

        def optimizer() -> None:
            wrapper.step()

        stages = dict(step=built.step, backbone=backbone, neck=neck, heads=heads)
        samples = time_interleaved(stages, warmup=setting.warmup, repeats=setting.repeats,
                                   sync=synchronizer(setting.device))
        model.zero_grad(set_to_none=True)  # a step's gradients, not stepped
        with wrapper.optim_context(model):
            losses = model.loss(images, built.samples)
        wrapper.backward(model.parse_losses(losses)[0])
        samples.update(time_interleaved(dict(optimizer=optimizer), warmup=setting.warmup,
                                        repeats=setting.repeats,
                                        sync=synchronizer(setting.device)))
        wrapper.zero_grad()
    ms = {name: 1e3 * sorted(times)[len(times) // 2] for name, times in samples.items()}
    parts = ('backbone', 'neck', 'heads', 'optimizer')
    return dict(kind='stages', config=os.path.basename(config), batch=images.shape[0],
                input=list(images.shape[2:]), amp=built.amp, dtype=dtype_name(built.compute),
                optimizer=type(wrapper.optimizer).__name__,
                param_groups=len(wrapper.optimizer.param_groups), ms=ms,
                parts_over_step=sum(ms[p] for p in parts) / ms['step'])


def measure_device_augment(setting: Setting) -> dict:
    """The DeiT recipe's device augmentation against a ViT-S/16 training step on its batch
    (``benchmark_data_pipeline.device_part_vs_step``); on a GPU also decoding on it."""
    from benchmarks import benchmark_data_pipeline as data_pipeline
    sizes = ({setting.augment_image_size: 1.0} if setting.augment_image_size
             else data_pipeline.IMAGE_SIZES)
    with tempfile.TemporaryDirectory() as folder:
        result = data_pipeline.device_part_vs_step(
            torch.device(setting.device), setting.augment_batch, setting.augment_rounds,
            Path(folder), sizes, gpu_decode=setting.device == 'cuda')
    return dict(kind='device-augment', **result)


def anchor_config() -> str:
    """mmdet's own ResNet-50 Mask R-CNN config (installed with mmdet)."""
    import mmdet
    return glob.glob(os.path.join(os.path.dirname(mmdet.__file__), '.mim', 'configs', ANCHOR))[0]


def report_cases(setting: Setting, models: tuple[str, ...],
                 compile_: bool = True) -> list[tuple[str, Measure]]:
    """Every case of the report, named, in the order they run (see the module doc); where
    the setting forces a talking-heads path, the step and backbone cases' names end with
    it."""
    amp = setting.device == 'cuda'  # as our detectors train (mmengine's AMP needs a GPU)
    forced = f' [{setting.talking_heads_path}]' if setting.talking_heads_path else ''
    cases: list[tuple[str, Measure]] = [(
        f'step {Path(ANCHOR).stem}{"+amp" if amp else ""}',
        lambda rates: measure_step(anchor_config(), setting, rates, amp=amp))]
    for config in setting.dense_configs:
        cases.append((f'step {Path(config).stem}{forced}',
                      lambda rates, c=config: measure_step(c, setting, rates)))
    for config in setting.stage_configs:
        if config == ANCHOR:
            cases.append((f'stages {Path(ANCHOR).stem}{"+amp" if amp else ""}',
                          lambda rates: measure_stages(anchor_config(), setting, rates,
                                                       amp=amp)))
        else:
            cases.append((f'stages {Path(config).stem}{forced}',
                          lambda rates, c=config: measure_stages(c, setting, rates)))
    for grid in setting.layer_grids:
        for path in (*talking_heads.available_paths(torch.device(setting.device)), PLAIN_SDPA):
            cases.append((f'talking-heads {path} {grid[0]}x{grid[1]}',
                          lambda rates, p=path, g=grid: measure_talking_heads(
                              p, g, setting, rates)))
    cases.append(('device-augment vs vit-s step',
                  lambda rates: measure_device_augment(setting)))
    specs = backbone_specs(models, setting)
    for compiled in (False, True) if compile_ else (False,):
        for spec in specs:
            for task in ('cls', 'dense'):
                cases.append((f'backbone {spec.name} {task} '
                              f'{"compiled" if compiled else "eager"}{forced}',
                              lambda rates, s=spec, t=task, c=compiled: measure_backbone(
                                  s, t, c, setting, rates)))
    return cases


# ---------------------------------------------------------------------- the run
class CaseTimeout(BaseException):
    """A case ran past its time limit (a BaseException, so no library code swallows it)."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Within: :class:`CaseTimeout` is raised once ``seconds`` have passed (SIGALRM)."""
    def expire(signum, frame) -> None:
        raise CaseTimeout(f'stopped at the {seconds:.0f} s case limit')
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def quiet_logs() -> None:
    """mmengine's logger (built models, optimizer wrappers) says only errors."""
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    logger.setLevel(logging.ERROR)
    for handler in logger.handlers:
        handler.setLevel(logging.ERROR)


def selected(cases: list[tuple[str, Measure]], patterns: Optional[list[str]]
             ) -> list[tuple[str, Measure]]:
    """The cases whose name matches one of the shell-style ``patterns`` or of the patterns
    of a set of :data:`CASE_SETS` named among them (all without)."""
    if not patterns:
        return cases
    patterns = [p for pattern in patterns for p in CASE_SETS.get(pattern, (pattern,))]
    chosen = [(name, m) for name, m in cases if any(fnmatch.fnmatch(name, p) for p in patterns)]
    if not chosen:
        raise SystemExit(f'no case matches {patterns}; --list shows them')
    return chosen


def run(setting: Setting, cases: list[tuple[str, Measure]], out: Path, budget_s: float,
        case_limit_s: float, retry_errors: bool = False,
        log: Callable[[dict], None] = print) -> None:
    """Measure the ``cases`` that ``out`` lacks, each appended to ``out`` when measured;
    no case starts after ``budget_s`` and each is stopped at ``case_limit_s``."""
    from vitdense.compat import apply_host_fixes
    apply_host_fixes()
    quiet_logs()
    done = recorded_cases(out)
    todo = [(name, m) for name, m in cases if name not in done
            or (retry_errors and 'error' in done[name])]
    if not todo:
        log(dict(record='run', note=f'every selected case is in {out}'))
        return
    start = time.perf_counter()
    rates = matmul_rates(setting)
    append_record(out, dict(record='run', **environment(setting.device, torch.get_num_threads()),
                            **versions(), **attention_setup(), backend=setting.backend,
                            matmul_tflops={k: v / 1e12 for k, v in rates.items()},
                            budget_s=budget_s, case_limit_s=case_limit_s, cases=len(todo)))
    for name, measure in todo:
        if time.perf_counter() - start > budget_s:
            log(dict(record='skipped', case=name, why=f'past the {budget_s:.0f} s budget'))
            continue
        case_start = time.perf_counter()
        try:
            with time_limit(case_limit_s), fused_attention():
                record = dict(record='case', case=name, **measure(rates))
        except (Exception, CaseTimeout) as error:  # recorded; the other cases go on
            record = dict(record='case', case=name, error=f'{type(error).__name__}: {error}'[:500],
                          traceback=traceback.format_exc()[-2000:])
        record['case_s'] = time.perf_counter() - case_start
        append_record(out, record)
        log(record)
        torch._dynamo.reset()
        if setting.device == 'cuda':
            torch.cuda.empty_cache()


def versions() -> dict:
    import mmcv
    import mmdet
    import mmengine
    import mmpretrain
    import mmseg
    info = dict(mmengine=mmengine.__version__, mmcv=mmcv.__version__, mmdet=mmdet.__version__,
                mmseg=mmseg.__version__, mmpretrain=mmpretrain.__version__)
    if torch.cuda.is_available():
        info['cuda'] = torch.version.cuda
    return info


# ---------------------------------------------------------------------- the page
def _number(value: Optional[float], percent: bool = False) -> str:
    if value is None:
        return ''
    return f'{100 * value:.1f} %' if percent else f'{value:.3g}'


def _kernels(record: dict) -> str:
    """The attention kernels of a step, and the operators its executed FLOPs leave out."""
    text = '; '.join(f'{c["kernel"]} q {"×".join(map(str, c["query"]))} {c["dtype"]}'
                     for c in record['attention']) or 'none'
    uncounted = record.get('uncounted_ops')
    return text + (f' (not counted: {", ".join(uncounted)})' if uncounted else '')


def _flops(record: dict) -> list[str]:
    return [_number(record['model_flops'] / 1e9), _number(record['executed_flops'] / 1e9),
            _number(record['model_share'], True), _number(record['executed_share'], True)]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ['| ' + ' | '.join(header) + ' |', '|---' * len(header) + '|',
            *('| ' + ' | '.join(row) + ' |' for row in rows), '']


def _step_rows(cases: dict[str, dict]) -> list[list[str]]:
    steps = [r for r in cases.values() if r.get('kind') == 'step']
    vit_b = {r['config'].split('_')[0]: r['ms'] for r in steps if '_vit-b-' in r['config']}
    anchor = next((r['ms'] for r in steps if r['config'].startswith('mask-rcnn_r50')), None)
    return [[r['config'], f'{r["batch"]} × {"×".join(map(str, r["input"]))}', r['dtype'],
             _number(r['ms']), _number(r['ms'] / vit_b[r['config'].split('_')[0]])
             if r['config'].split('_')[0] in vit_b else '',
             _number(r['ms'] / anchor) if anchor and r['config'].startswith('mask-rcnn') else '',
             *_flops(r),
             _number(r.get('real_gib')), _number(r['account_gib']), _kernels(r)]
            for r in steps]


def markdown(records: list[dict]) -> str:
    """The report as a Markdown page: the last run's environment, one table per kind of
    case, then the cases that failed."""
    runs = [r for r in records if r.get('record') == 'run' and 'device' in r]
    cases = {r['case']: r for r in records if r.get('record') == 'case'}
    env = runs[-1] if runs else {}
    lines = ['## Results', '',
             'Written by `python -m benchmarks.gpu_report --docs PAGE --render` from its '
             'records. Shares: '
             'FLOPs (2 per multiply-add) / step time / the matmul rate of the step\'s compute '
             'type, measured in the same run; *model*: the architecture\'s FLOPs (talking '
             'heads written out), *executed*: what the kernels that ran execute.', '',
             ', '.join(f'{k} {env[k]}' for k in ('device', 'gpu', 'torch', 'cuda', 'cudnn',
                                                  'timm', 'mmdet', 'mmseg', 'backend', 'date')
                       if k in env) + '.', '']
    if env:
        lines += ['SDPA preference order: ' + ', '.join(env['sdpa_priority']) + '. Matmul '
                  'TFLOP/s: ' + ', '.join(f'{k} {_number(v)}' for k, v in
                                          env['matmul_tflops'].items()) + '.', '']
    lines += ['### Training steps', ''] + _table(
        ['config', 'batch × input', 'compute', 'ms', '/ ViT-B', '/ R50', 'model GFLOP',
         'executed GFLOP', 'model share', 'executed share', 'real GiB', 'account GiB',
         'attention kernels'], _step_rows(cases))
    heads = [r for r in cases.values() if r.get('kind') == 'talking-heads']
    plain = {tuple(r['grid']): r['ms'] for r in heads if r['path'] == PLAIN_SDPA}
    lines += ['### Talking heads, one CaiT-S24 layer per path', '',
              f'`{PLAIN_SDPA}`: the same layer without talking heads (SDPA on the same heads '
              f'and widths); */ {PLAIN_SDPA}*: the path\'s time over it in the same run.', '']
    lines += _table(
        ['path', 'grid', 'ms', f'/ {PLAIN_SDPA}', 'backward bit-identical', 'model GFLOP',
         'executed GFLOP', 'model share', 'executed share', 'memory GiB', 'attention kernels'],
        [[r['path'], '×'.join(map(str, r['grid'])), _number(r['ms']),
          _number(r['ms'] / plain[tuple(r['grid'])]) if tuple(r['grid']) in plain else '',
          {True: 'yes', False: 'no'}.get(r.get('backward_bit_identical'), ''), *_flops(r),
          _number(r.get('memory_gib')), _kernels(r)] for r in heads])
    stages = [r for r in cases.values() if r.get('kind') == 'stages']
    if stages:
        parts = ('step', 'backbone', 'neck', 'heads', 'optimizer')
        lines += ['### Mask R-CNN steps by stage', '',
                  'Each stage timed alone, interleaved with the whole step (ms): the '
                  'backbone\'s, the neck\'s and the heads\' forward and backward, the '
                  'optimizer wrapper\'s step; *parts / step*: their sum over the step.', '']
        lines += _table(
            ['config', 'batch × input', 'compute', 'optimizer', 'groups', *parts,
             'parts / step'],
            [[r['config'], f'{r["batch"]} × {"×".join(map(str, r["input"]))}', r['dtype'],
              r['optimizer'], str(r['param_groups']), *(_number(r['ms'][p]) for p in parts),
              _number(r['parts_over_step'])] for r in stages])
    backbones = [r for r in cases.values() if r.get('kind') == 'backbone']
    lines += ['### Backbones', '', '*cls*: the classifier\'s backbone (class token out; '
              'timm: pooled features), *dense*: the columnar block outputs.', ''] + _table(
        ['model', 'task', 'mode', 'batch × input', 'impl', 'ms', 'first call s',
         'model GFLOP', 'executed GFLOP', 'model share', 'executed share', 'attention kernels'],
        [[r['model'], r['task'], 'compiled' if r['compiled'] else 'eager',
          f'{r["batch"]} × {"×".join(map(str, r["input"]))}', impl, _number(r[impl]['ms']),
          _number(r.get(f'{impl} first_call_s')), *_flops(r[impl]),
          _kernels(r[impl])]
         for r in backbones for impl in ('vitdense', 'timm') if impl in r])
    augments = [r for r in cases.values() if r.get('kind') == 'device-augment']
    if augments:
        lines += ['### Augmentation on the device against a ViT-S/16 step', ''] + _table(
            ['batch', 'images', 'ViT-S step ms', 'step compute', 'device part', 'ms',
             '% of the step', 'floor'],
            [[str(r['batch']), ', '.join(r['image_sizes']), _number(r['vit_s_step_ms']),
              r['step_dtype'], name, _number(ms),
              f'{r["device_part_percent"][name]:.1f} %', f'{r["floor_percent"]:.0f} %']
             for r in augments for name, ms in r['device_part_ms'].items()])
    failed = [[name, r['error']] for name, r in cases.items() if 'error' in r]
    if failed:
        lines += ['### Cases that failed', ''] + _table(['case', 'error'], failed)
    return '\n'.join(lines)


#: the lines around the part of a page that :func:`write_page` rewrites
RESULTS_BEGIN, RESULTS_END = '<!-- gpu_report results -->', '<!-- end of gpu_report results -->'


def write_page(path: Path, results: str) -> None:
    """Put ``results`` between the page's :data:`RESULTS_BEGIN` / :data:`RESULTS_END` lines
    (at its end the first time), the rest of the page kept; written in one step (a
    temporary file renamed over it)."""
    text = path.read_text() if path.exists() else ''
    section = f'{RESULTS_BEGIN}\n{results.rstrip()}\n{RESULTS_END}\n'
    if RESULTS_BEGIN in text and RESULTS_END in text:
        head, rest = text.split(RESULTS_BEGIN, 1)
        text = head + section + rest.split(RESULTS_END, 1)[1].lstrip('\n')
    else:
        text = text + ('\n' if text and not text.endswith('\n\n') else '') + section
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + '.partial')
    partial.write_text(text)
    os.replace(partial, path)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default='work_dirs/gpu_report.jsonl', type=Path,
                        help='JSON lines: appended to, and the cases it holds are skipped')
    parser.add_argument('--cases', nargs='+', metavar='PATTERN',
                        help="shell-style patterns of case names (e.g. 'step *') or names of "
                             f"sets of them ({', '.join(CASE_SETS)}); default all")
    parser.add_argument('--list', action='store_true',
                        help='print the selected cases and what --out holds of each, and stop')
    parser.add_argument('--models', nargs='+', default=HEADLINE_MODELS, metavar='TIMM_NAME',
                        help='the backbone cases\' models')
    parser.add_argument('--no-compile', action='store_true', help='no compiled backbone cases')
    parser.add_argument('--talking-heads', choices=talking_heads.PATHS, metavar='PATH',
                        help='force this talking-heads path in the step and backbone cases '
                             f'(one of {", ".join(talking_heads.PATHS)}; default: chosen per '
                             'call)')
    parser.add_argument('--budget-s', type=float,
                        help='start no case after this many seconds (default '
                             f'{GPU.budget_s:.0f} on a GPU, none on a CPU)')
    parser.add_argument('--case-limit-s', type=float,
                        help='stop a case (recorded as an error) after this many seconds '
                             f'(default {GPU.case_limit_s:.0f} on a GPU, {CPU.case_limit_s:.0f} '
                             'on a CPU)')
    parser.add_argument('--retry-errors', action='store_true',
                        help='measure again the cases --out holds as errors')
    parser.add_argument('--docs', type=Path,
                        help="write --out's results into this Markdown page (its results "
                             'section; the rest of the page is kept)')
    parser.add_argument('--render', action='store_true', help='only write --docs, measure nothing')
    parser.add_argument('--device', choices=['cuda', 'cpu'],
                        default='cuda' if torch.cuda.is_available() else 'cpu')
    args = parser.parse_args(argv)
    if args.render and not args.docs:
        parser.error('--render writes --docs: name the page')
    setting = replace(GPU if args.device == 'cuda' else CPU,
                      talking_heads_path=args.talking_heads)
    if not args.render:
        cases = selected(report_cases(setting, tuple(args.models), not args.no_compile),
                         args.cases)
        if args.list:
            done = recorded_cases(args.out)
            for name, _ in cases:
                state = 'to do' if name not in done else 'error' if 'error' in done[name] \
                    else 'recorded'
                print(f'{state:8} {name}')
            return
        run(setting, cases, args.out, args.budget_s or setting.budget_s,
            args.case_limit_s or setting.case_limit_s, args.retry_errors,
            log=lambda record: print(json.dumps(record, default=str), flush=True))
    if args.docs:
        write_page(args.docs, markdown(read_records(args.out)))


if __name__ == '__main__':
    main()
