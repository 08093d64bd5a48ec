"""Measure models fairly: time per step, peak memory and FLOPs, side by side.

The pieces ``benchmarks/benchmark.py`` (backbones vs timm) and ``benchmarks/benchmark_dense.py``
(detectors / segmentors) share:

- :func:`time_interleaved`: several steps timed in alternating order after a warm-up, so
  that load changes on a shared machine hit every model alike; the median is reported, and
  :func:`paired_ratio` compares two steps sample by sample (neighbours in time).
- :func:`count_flops` (:func:`vitdense.analysis.complexity.count_flops`): FLOPs of a step,
  2 per multiply-add, with torch's CPU flash-attention kernels counted.
- :func:`run_probe` runs a measurement in a fresh subprocess (:func:`module_command`: a
  module of this folder run from the repository root; timing in several processes
  averages out where each one's buffers happen to land in memory);
  :func:`probe_memory` runs one model in a fresh subprocess: on CPU the peak resident set
  (``VmHWM``) of that process above its size after imports, so nothing the parent holds
  (the other model, allocator caches) counts; on CUDA ``max_memory_allocated``.
- backbone pairs: a vitdense backbone and its timm reference on the same weights
  (:func:`build_backbone_pair`), in classification or dense form.
- reporting: JSON, a terminal table (rich) and memory / time vs tokens plots (XCiT Fig. 2).

Nothing here imports mmdet or mmseg; the dense benchmark builds its models with
:func:`vitdense.model_factory.build_model`. This module measures, it is not library code:
it lives with the benchmarks (the package ``benchmarks``, run as ``python -m
benchmarks.<name>`` from the repository root) and depends on ``vitdense``, never the reverse.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
import torch.nn as nn

from vitdense.analysis.complexity import count_flops  # noqa: F401  (the benchmarks' FLOPs)

ROOT = Path(__file__).resolve().parents[1]
PROBE_PREFIX = 'VITDENSE_PROBE '
TASKS = ('cls', 'dense')
MODES = ('infer', 'train')
ATTENTIONS = ('fused', 'explicit')
OURS, TIMM = 'vitdense', 'timm'

Step = Callable[[], None]


# ---------------------------------------------------------------------- environment
def default_threads() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


def synchronizer(device: str) -> Callable[[], None]:
    """Waits for queued device work (CUDA is asynchronous); a no-op on CPU."""
    if device.startswith('cuda'):
        return torch.cuda.synchronize
    return lambda: None


def environment(device: str, threads: int) -> dict:
    """What a reader needs to interpret the numbers."""
    info = dict(torch=torch.__version__, python=platform.python_version(),
                machine=platform.machine(), device=device, threads=threads,
                cpu=_cpu_name(), load_average=list(os.getloadavg()),
                date=time.strftime('%Y-%m-%d %H:%M:%S'))
    try:
        import timm
        info['timm'] = timm.__version__
    except ImportError:
        pass
    if device.startswith('cuda'):
        info['gpu'] = torch.cuda.get_device_name(device)
    return info


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path('/proc/cpuinfo').read_text().splitlines():
            if line.startswith('model name'):
                return line.split(':', 1)[1].strip()
    return platform.processor()


@contextlib.contextmanager
def attention_backend(attention: str) -> Iterator[None]:
    """'fused': PyTorch picks its fused SDPA kernel; 'explicit': SDPA runs its math
    backend, which materialises the (N, N) attention map like a hand-written softmax(QKᵀ)V.
    Models that never call SDPA (talking heads) are unaffected either way."""
    if attention not in ATTENTIONS:
        raise ValueError(f'attention must be one of {ATTENTIONS}, got {attention!r}')
    if attention == 'fused':
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        yield


# ---------------------------------------------------------------------- steps
def make_step(model: nn.Module, inputs: torch.Tensor, mode: str,
              attention: str = 'fused', dtype: Optional[torch.dtype] = None) -> Step:
    """One inference forward (no grad) or one training step (forward, a scalar loss over
    all outputs, backward; gradients are dropped before each step); with ``dtype``, the
    forward runs under autocast to it on the inputs' device.

    For inference the parameters are frozen as in deployment; besides, views of parameters
    taken under ``no_grad`` still claim ``requires_grad``, which breaks FLOP counting.
    """
    if mode not in MODES:
        raise ValueError(f'mode must be one of {MODES}, got {mode!r}')
    model.train(mode == 'train')
    model.requires_grad_(mode == 'train')

    def autocast() -> torch.autocast:
        return torch.autocast(inputs.device.type, dtype=dtype, enabled=dtype is not None)

    def infer() -> None:
        with torch.no_grad(), attention_backend(attention), autocast():
            model(inputs)

    def train() -> None:
        model.zero_grad(set_to_none=True)
        with attention_backend(attention):
            with autocast():
                outputs = flatten_outputs(model(inputs))
            sum(out.float().mean() for out in outputs).backward()

    return infer if mode == 'infer' else train


def flatten_outputs(outputs: Any) -> list[torch.Tensor]:
    """The tensors of a (nested) tuple / list / dict of outputs."""
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    if isinstance(outputs, dict):
        outputs = list(outputs.values())
    return [t for item in outputs for t in flatten_outputs(item)]


def time_interleaved(steps: dict[str, Step], warmup: int = 2, repeats: int = 5,
                     min_repeat_s: float = 0.2,
                     sync: Callable[[], None] = lambda: None) -> dict[str, list[float]]:
    """Seconds per step of each named step, ``repeats`` samples each.

    All steps warm up first (at least once; the last round also sizes the samples); a
    sample runs a step enough times to last about ``min_repeat_s`` (the same count for every
    step), and the steps alternate their order from one sample to the next so that a change
    of machine load affects all of them.
    """
    for _ in range(max(warmup, 1)):
        slowest = max(_elapsed(step, 1, sync) for step in steps.values())
    inner = max(1, math.ceil(min_repeat_s / max(slowest, 1e-9)))
    samples: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else reversed(names):
            samples[name].append(_elapsed(steps[name], inner, sync) / inner)
    return samples


def first_call_s(step: Step, device: str) -> float:
    """Seconds of one call of ``step``, device work included: for a compiled step's first
    call, the compile time."""
    start = time.perf_counter()
    step()
    synchronizer(device)()
    return time.perf_counter() - start


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    """Median of ``numerator[i] / denominator[i]``: samples taken next to each other by
    :func:`time_interleaved`, so a slow drift of the machine cancels within each pair."""
    return statistics.median(n / d for n, d in zip(numerator, denominator))


def _elapsed(step: Step, count: int, sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(count):
        step()
    sync()
    return time.perf_counter() - start


def summarize_times(samples: Sequence[float], batch: int) -> dict:
    """Median seconds per step, images per second and the spread of the samples."""
    median = statistics.median(samples)
    return dict(step_s=median, images_per_s=batch / median, ms_per_image=1e3 * median / batch,
                spread=(max(samples) - min(samples)) / median, samples_s=list(samples))


# ---------------------------------------------------------------------- memory
def _proc_status_kib(field_name: str) -> int:
    for line in Path('/proc/self/status').read_text().splitlines():
        if line.startswith(field_name + ':'):
            return int(line.split()[1])
    raise KeyError(field_name)


def _reset_peak_rss() -> bool:
    """Make ``VmHWM`` restart from the current size (Linux >= 4.0); False if refused."""
    try:
        Path('/proc/self/clear_refs').write_text('5')
    except OSError:
        return False
    return True


class MemoryMeter:
    """Peak memory of the steps run inside ``measure`` in this process.

    CPU: ``VmHWM`` (peak resident set) minus the resident size at construction time, which
    should be right after imports; ``activation_mb`` is the part above the size right
    before the measured steps (weights, inputs and caches excluded).
    CUDA: ``max_memory_allocated`` (weights and inputs included) and its part above the
    memory allocated before the measured steps.
    """

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith('cuda')
        self.baseline_kib = 0 if self.cuda else _proc_status_kib('VmRSS')

    def measure(self, step: Step, warmup: int = 1, repeats: int = 1) -> dict:
        for _ in range(warmup):
            step()
        if self.cuda:
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            for _ in range(repeats):
                step()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
            return dict(memory_mb=peak / 2 ** 20, activation_mb=(peak - before) / 2 ** 20,
                        memory_kind='cuda max_memory_allocated')
        before_kib = _proc_status_kib('VmRSS')
        reset = _reset_peak_rss()
        for _ in range(repeats):
            step()
        peak_kib = _proc_status_kib('VmHWM')
        kind = 'cpu VmHWM - RSS after imports' + ('' if reset else ' (peak incl. construction)')
        return dict(memory_mb=(peak_kib - self.baseline_kib) / 1024,
                    activation_mb=(peak_kib - before_kib) / 1024 if reset else None,
                    memory_kind=kind)


def module_command(module: str, *args: str) -> list[str]:
    """``python -m module args...``: a module of the ``benchmarks`` package in a fresh
    interpreter (:func:`run_probe` starts it in the repository root, where it is found)."""
    return [sys.executable, '-m', module, *args]


def run_probe(command: Sequence[str], spec: dict, timeout_s: float = 1800.,
              env: Optional[dict] = None, error_key: str = 'probe_error') -> dict:
    """Run ``command + [json(spec)]`` in a fresh process in the repository root (``env``
    added to this one's, ``spec['threads']`` OpenMP threads) and return the dict it reports
    with :func:`report_probe`, or ``{error_key: why}``."""
    env = dict(os.environ, OMP_NUM_THREADS=str(spec.get('threads', default_threads())),
               **(env or {}))
    try:
        proc = subprocess.run([*command, json.dumps(spec)], capture_output=True, text=True,
                              env=env, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {error_key: f'probe timed out after {timeout_s:.0f} s'}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(PROBE_PREFIX):
            return json.loads(line[len(PROBE_PREFIX):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {error_key: f'probe exited with {proc.returncode}: ' + ' | '.join(tail)}


def probe_memory(command: Sequence[str], spec: dict, timeout_s: float = 1800.) -> dict:
    """:func:`run_probe` for one model's peak memory (``memory_error`` on failure).

    On CPU, glibc's mmap threshold is pinned so that freed tensors go back to the system
    and the resident size follows live memory.
    """
    return run_probe(command, spec, timeout_s, dict(MALLOC_MMAP_THRESHOLD_='131072'),
                     error_key='memory_error')


def report_probe(result: dict) -> None:
    """The child side of :func:`run_probe`: one tagged JSON line on stdout."""
    print(PROBE_PREFIX + json.dumps(result), flush=True)


# ---------------------------------------------------------------------- backbone pairs
@dataclass(frozen=True)
class BackboneSpec:
    """A vitdense arch and the timm model it reproduces (None if timm has none)."""

    name: str
    family: str
    arch: str
    options: dict = field(default_factory=dict)
    timm_name: Optional[str] = None

    @property
    def patch_size(self) -> int:
        return self.options.get('patch_size', 16)


def backbone_specs() -> dict[str, BackboneSpec]:
    """Every named variant of the registered families (their ``timm_models``), named by
    its timm model (``vitdense_<family>_<arch>[_<options>]`` for archs timm lacks)."""
    from vitdense.models import backbone_families

    specs = {}
    for family, cls in backbone_families().items():
        for arch, options, timm_name in cls.timm_models:
            name = timm_name or '_'.join(
                ['vitdense', family, arch] + [f'{k}-{v}' for k, v in options.items()])
            specs[name] = BackboneSpec(name, family, arch, dict(options), timm_name)
    return specs


class TimmDense(nn.Module):
    """A timm model returning the block outputs that our dense mode returns (NCHW, no
    norm, stopping after the last one), i.e. the same computation."""

    def __init__(self, model: nn.Module, indices: Sequence[int]) -> None:
        super().__init__()
        self.model = model
        self.indices = list(indices)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return self.model.forward_intermediates(x, indices=self.indices, norm=False,
                                                output_fmt='NCHW', intermediates_only=True,
                                                stop_early=True)


def build_ours(spec: BackboneSpec, task: str, img_size: int) -> nn.Module:
    """Our backbone: final class token for 'cls', columnar block outputs for 'dense'
    (``pyramid=False``, what timm can compute too); position tables sized for the input."""
    from vitdense.models import backbone_families

    if task not in TASKS:
        raise ValueError(f'task must be one of {TASKS}, got {task!r}')
    cls = backbone_families()[spec.family]
    options = {**spec.options, 'img_size': img_size}
    if task == 'cls':
        return cls(spec.arch, out_type='cls_token', **options)
    return cls(spec.arch, out_type='featmap', pyramid=False, **options)


def build_timm(spec: BackboneSpec, task: str, img_size: int) -> nn.Module:
    """The timm model built for ``img_size`` inputs, without classifier (pooled features)
    for 'cls', wrapped in :class:`TimmDense` with our default out indices for 'dense'."""
    import timm

    from vitdense.models.backbones.options import default_out_indices

    if spec.timm_name is None:
        raise ValueError(f'{spec.name} has no timm counterpart')
    model = timm.create_model(spec.timm_name, pretrained=False, num_classes=0,
                              img_size=img_size)
    return model if task == 'cls' else TimmDense(model, default_out_indices(len(model.blocks)))


def build_backbone_pair(spec: BackboneSpec, task: str, img_size: int, seed: int = 0,
                        reference_first: bool = False) -> dict[str, nn.Module]:
    """Ours and (where it exists) timm's model on the same weights: timm's random init is
    loaded into ours through our checkpoint conversion. ``reference_first`` builds timm's
    model first (its parameters then come first in memory; same weights)."""
    torch.manual_seed(seed)
    if spec.timm_name is None:
        return {OURS: build_ours(spec, task, img_size)}
    if reference_first:
        reference = build_timm(spec, task, img_size)
        ours = build_ours(spec, task, img_size)
    else:
        ours = build_ours(spec, task, img_size)
        reference = build_timm(spec, task, img_size)
    from vitdense.models import adapt_checkpoint
    state_dict = (reference.model if task == 'dense' else reference).state_dict()
    ours.load_state_dict(adapt_checkpoint(ours, state_dict))
    return {OURS: ours, TIMM: reference}


def max_abs_difference(models: dict[str, nn.Module], inputs: torch.Tensor) -> Optional[float]:
    """Largest absolute difference between ours and timm's outputs (eval mode)."""
    if TIMM not in models:
        return None
    outputs = {}
    for name in (OURS, TIMM):
        models[name].eval()
        with torch.no_grad():
            outputs[name] = flatten_outputs(models[name](inputs))
    return max((a.float() - b.float()).abs().max().item()
               for a, b in zip(outputs[OURS], outputs[TIMM]))


# ---------------------------------------------------------------------- reporting
@dataclass(frozen=True)
class Case:
    """One measurement: a backbone at an input size, batch, task, mode and attention."""

    model: str
    task: str = 'cls'
    img_size: int = 224
    batch: int = 1
    mode: str = 'infer'
    attention: str = 'fused'

    def as_dict(self) -> dict:
        return asdict(self)


def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def write_json(path: Path, meta: dict, results: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(meta=meta, results=results), indent=1))


def curve_key(record: dict, impl: str, varying: Sequence[str]) -> str:
    """Legend label of one line: the implementation, the model and whatever else varies."""
    parts = [record['model'], impl] + [f'{k}={record[k]}' for k in varying]
    return ' '.join(parts)


def plot_scaling(results: list[dict], path: Path, title: str = '') -> Optional[Path]:
    """Peak memory and time per image against the number of tokens, one line per model and
    implementation (XCiT Fig. 2). Only the lines with the most input sizes are drawn (the
    scaling study of a run), none if no line has two; returns the path or None."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    keys = ('task', 'batch', 'mode', 'attention')
    varying = [k for k in keys if len({r[k] for r in results}) > 1]
    lines: dict[str, list[tuple[int, Optional[float], Optional[float]]]] = {}
    for record in results:
        for impl, values in record['impls'].items():
            lines.setdefault(curve_key(record, impl, varying), []).append(
                (record['tokens'], values.get('memory_mb'), values.get('ms_per_image')))
    longest = max(len({t for t, *_ in v}) for v in lines.values()) if lines else 0
    if longest < 2:
        return None
    lines = {k: sorted(v) for k, v in lines.items() if len({t for t, *_ in v}) == longest}
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    measured = [False, False]
    for label, points in sorted(lines.items()):
        style = '--' if f' {TIMM}' in label else '-'
        for index, (axis, column) in enumerate(zip(axes, (1, 2))):
            xs = [p[0] for p in points if p[column] is not None]
            ys = [p[column] for p in points if p[column] is not None]
            axis.plot(xs, ys, style, marker='o', label=label)
            measured[index] |= bool(ys)
    axes[0].set_ylabel('peak memory (MiB)')
    axes[1].set_ylabel('time per image (ms)')
    for axis, has_data in zip(axes, measured):
        axis.set_xlabel('number of patch tokens')
        if not has_data:  # e.g. --no-memory: an empty log axis cannot be drawn
            axis.text(.5, .5, 'not measured', ha='center', transform=axis.transAxes)
            continue
        axis.set_xscale('log')
        axis.set_yscale('log')
        axis.grid(True, which='both', alpha=.3)
    axes[1].legend(fontsize=7, loc='upper left')
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
