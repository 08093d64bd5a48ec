"""vitdense's torch-native mmcv ops against compiled mmcv: op parity, then the demo trained twice.

Run it in an environment with the compiled mmcv (``bash tools/install.sh --full-mmcv``); the
torch-native ops are loaded from ``vitdense/compat/mmcv_ext.py`` beside it, and each case
switches mmcv's op modules between the two extensions.

1. Parity, op by op: RoIAlign forward and backward (aligned and not, sampling ratio 0 and 2,
   boxes across the border and outside the map, degenerate and empty RoIs, batch index > 0,
   float32 and float16) as the largest absolute difference; nms, batched_nms and mmdet's
   multiclass_nms (ties, no boxes, the > 10,000-box path, class offsets, ``offset=1``,
   ``score_threshold`` / ``max_num``) as whether the kept indices are identical.
2. Speed, op by op, at Mask R-CNN's sizes: RoIAlign forward + backward and nms, the two
   extensions timed alternately, median of each and median of the paired ratios.
3. The demo Mask R-CNN (``configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py``) trained for a
   fixed number of iterations twice from the same initial weights, one model per extension,
   step by step interleaved (the same batch and the same random state for both, which goes
   first alternating), then evaluated with mmdet's COCO metric under its own extension:
   bbox / segm mAP of each, and the median training-step time of each.

    python -m benchmarks.benchmark_mmcv_ops --iters 150 --out benchmarks/results/mmcv_ops.json

4. Without a compiled mmcv (``--pure-torch``): the served multi-scale deformable attention and
   sigmoid focal loss against mmcv's (and mmdet's) pure-torch paths, forward + backward at
   DINO's and RetinaNet's sizes: median step time and peak memory, each path in a process of
   its own (on a CPU the peak is the rise of the peak resident memory over the inputs').

    python -m benchmarks.benchmark_mmcv_ops --pure-torch --out benchmarks/results/mmcv_pure_torch.json

5. Without a compiled mmcv (``--against REV``): soft-NMS of 8,000 boxes, multi-scale
   deformable attention as in 4, and PSAMask at PSANet's ADE20K and Cityscapes shapes
   (forward, and forward + backward), served by this tree and by git revision ``REV`` of
   ``vitdense/compat/mmcv_ext.py``, each in a process of its own: median time, peak memory
   and the peak over PSAMask's output size.

    python -m benchmarks.benchmark_mmcv_ops --against REV --device cpu --out against.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator

import torch
from mmengine.evaluator import Evaluator
from mmengine.optim import build_optim_wrapper
from mmengine.registry import PARAM_SCHEDULERS, DefaultScope
from mmengine.runner import Runner

import vitdense  # noqa: F401  (vitdense registries)
from vitdense.compat import mmcv_ext as torch_native
from vitdense.demo_data import make_demo_coco
from vitdense.model_factory import build_model
from vitdense.engine.tool_config import load_config, point_at_data_root

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / 'configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py'


def compiled_ext() -> ModuleType:
    import mmcv.ops  # noqa: F401  (loads mmcv._ext)
    ext = sys.modules['mmcv._ext']
    if ext.__file__ == torch_native.__file__:
        sys.exit('this environment has no compiled mmcv: run it after '
                 '`bash tools/install.sh --full-mmcv`')
    return ext


@contextlib.contextmanager
def using(ext: ModuleType) -> Iterator[None]:
    """mmcv's op modules call ``ext`` inside the block."""
    modules = [m for name, m in list(sys.modules.items())
               if name.startswith('mmcv.ops.') and hasattr(m, 'ext_module')]
    before = [m.ext_module for m in modules]
    for module in modules:
        module.ext_module = ext
    try:
        yield
    finally:
        for module, old in zip(modules, before):
            module.ext_module = old


# --- 1. parity ---------------------------------------------------------------------------

def _boxes(n: int, gen: torch.Generator, size: float = 200.0) -> torch.Tensor:
    xy = torch.rand(n, 2, generator=gen) * size
    return torch.cat([xy, xy + torch.rand(n, 2, generator=gen) * size / 4], 1)


def _rois(gen: torch.Generator, feat_hw: tuple[int, int], scale: float) -> torch.Tensor:
    """Random RoIs plus the edge cases: across the border, outside, zero size, the whole map."""
    h, w = feat_hw[0] / scale, feat_hw[1] / scale
    random = torch.cat([torch.randint(0, 2, (40, 1), generator=gen).float(),
                        _boxes(40, gen, size=max(h, w))], 1)
    edges = torch.tensor([[1, -10, -10, 0.3 * w, 0.4 * h], [0, 0.8 * w, 0.7 * h, 1.3 * w, 1.2 * h],
                          [1, 1.5 * w, 1.5 * h, 2 * w, 2 * h], [0, 5, 5, 5, 5], [1, 0, 0, w, h]])
    return torch.cat([random, edges])


def roi_align_cases(compiled: ModuleType) -> list[dict]:
    import mmcv.ops
    gen = torch.Generator().manual_seed(0)
    rows = []
    for dtype in (torch.float32, torch.float16):
        for aligned in (True, False):
            for sampling_ratio in (0, 2):
                for scale in (1.0, 0.25):
                    feats = torch.randn(2, 16, 24, 40, generator=gen).to(dtype)
                    rois = _rois(gen, (24, 40), scale).to(dtype)
                    grad = torch.randn(len(rois), 16, 7, 7, generator=gen).to(dtype)
                    row = dict(op='roi_align', dtype=str(dtype).split('.')[-1],
                               aligned=aligned, sampling_ratio=sampling_ratio,
                               spatial_scale=scale, rois=len(rois))
                    results = []
                    for label, ext in (('compiled', compiled), ('torch_native', torch_native)):
                        x = feats.clone().requires_grad_()
                        try:
                            with using(ext):
                                out = mmcv.ops.roi_align(x, rois, (7, 7), scale,
                                                         sampling_ratio, 'avg', aligned)
                                out.backward(grad)
                        except RuntimeError as err:  # a kernel without this dtype
                            row[f'error_{label}'] = str(err).splitlines()[0]
                            break
                        results.append((out.detach().float(), x.grad.float()))
                    if len(results) == 2:
                        (out_c, grad_c), (out_t, grad_t) = results
                        row.update(forward_max_abs_diff=(out_c - out_t).abs().max().item(),
                                   backward_max_abs_diff=(grad_c - grad_t).abs().max().item())
                    rows.append(row)
    for label, ext in (('compiled', compiled), ('torch_native', torch_native)):
        feats = torch.randn(1, 4, 8, 8, generator=gen)
        with using(ext):
            empty = mmcv.ops.roi_align(feats, torch.zeros(0, 5), 7)
        rows.append(dict(op='roi_align', case='empty rois', ext=label, shape=list(empty.shape)))
        # x2 < x1, y2 < y1: mmcv's CPU kernel asserts in aligned mode; the formula (and
        # mmcv's CUDA kernel) averages over an empty grid, i.e. gives zeros
        try:
            with using(ext):
                out = mmcv.ops.roi_align(feats, torch.tensor([[0, 6., 6., 2., 3.]]), 7, 1.0, 0)
            result = f'max |output| {out.abs().max().item():g}'
        except RuntimeError as err:
            result = str(err).splitlines()[0]
        rows.append(dict(op='roi_align', case='negative size, aligned', ext=label,
                         result=result))
    return rows


def _same_kept(compiled: ModuleType, call: Callable[[], tuple]) -> bool:
    kept = []
    for ext in (compiled, torch_native):
        with using(ext):
            kept.append([t.clone() for t in call()])
    return all(torch.equal(a, b) for a, b in zip(*kept))


def nms_cases(compiled: ModuleType) -> list[dict]:
    import mmcv.ops
    from mmdet.models.layers import multiclass_nms
    gen = torch.Generator().manual_seed(1)
    rows = []
    for n in (0, 1, 50, 2000):
        boxes, scores = _boxes(n, gen), torch.rand(n, generator=gen)
        for offset in (0, 1):
            rows.append(dict(op='nms', boxes=n, offset=offset, identical=_same_kept(
                compiled, lambda: mmcv.ops.nms(boxes, scores, 0.5, offset=offset))))
    boxes = _boxes(500, gen)
    ties = torch.randint(0, 5, (500,), generator=gen).float() / 5
    rows.append(dict(op='nms', case='tied scores', identical=_same_kept(
        compiled, lambda: mmcv.ops.nms(boxes, ties, 0.5))))
    scores = torch.rand(500, generator=gen)
    rows.append(dict(op='nms', case='score_threshold 0.3, max_num 20', identical=_same_kept(
        compiled, lambda: mmcv.ops.nms(boxes, scores, 0.5, score_threshold=0.3, max_num=20))))
    for n in (3000, 12000):  # the second above batched_nms's split_thr (10,000): per class
        boxes, scores = _boxes(n, gen, 800.0), torch.rand(n, generator=gen)
        labels = torch.randint(0, 80, (n,), generator=gen)
        rows.append(dict(op='batched_nms', boxes=n, classes=80, identical=_same_kept(
            compiled, lambda: mmcv.ops.batched_nms(boxes, scores, labels,
                                                   dict(type='nms', iou_threshold=0.7)))))
    boxes, scores = _boxes(1000, gen), torch.rand(1000, 81, generator=gen).softmax(1)
    rows.append(dict(op='multiclass_nms', boxes=1000, classes=80, identical=_same_kept(
        compiled, lambda: multiclass_nms(boxes, scores, 0.05, dict(type='nms', iou_threshold=0.5),
                                         max_num=100, return_inds=True))))
    return rows


# --- 2. speed of the ops ------------------------------------------------------------------

def _roi_align_step(channels: int, rois: int, size: int, gen: torch.Generator) -> Callable:
    """RoIAlign forward and backward on a stride-4 FPN level of two 160 x 160 images."""
    import mmcv.ops
    feats = torch.randn(2, channels, 40, 40, generator=gen, requires_grad=True)
    boxes = torch.cat([torch.randint(0, 2, (rois, 1), generator=gen).float(),
                       _boxes(rois, gen, size=160.0)], 1)

    def step() -> None:
        mmcv.ops.roi_align(feats, boxes, size, 0.25, 0, 'avg', True).sum().backward()
    return step


def _nms_step(n: int, gen: torch.Generator) -> Callable:
    import mmcv.ops
    boxes, scores = _boxes(n, gen, 800.0), torch.rand(n, generator=gen)
    return lambda: mmcv.ops.nms(boxes, scores, 0.7)


def op_speed(compiled: ModuleType, repeats: int = 30) -> list[dict]:
    gen = torch.Generator().manual_seed(2)
    cases = {'roi_align fwd+bwd, 256 ch, 512 RoIs, 7x7 (box head)':
             _roi_align_step(256, 512, 7, gen),
             'roi_align fwd+bwd, 256 ch, 128 RoIs, 14x14 (mask head)':
             _roi_align_step(256, 128, 14, gen),
             'nms, 2000 boxes (RPN level)': _nms_step(2000, gen),
             'nms, 12000 boxes': _nms_step(12000, gen)}
    extensions = {'compiled': compiled, 'torch-native': torch_native}
    rows = []
    for case, step in cases.items():
        times: dict[str, list[float]] = {name: [] for name in extensions}
        for i in range(repeats):
            for name in (list(extensions) if i % 2 == 0 else list(reversed(extensions))):
                with using(extensions[name]):
                    start = time.perf_counter()
                    step()
                    times[name].append(time.perf_counter() - start)
        pairs = [c / t for c, t in zip(times['compiled'], times['torch-native'])]
        rows.append(dict(case=case, **{f'{n}_ms_median': 1e3 * statistics.median(t)
                                       for n, t in times.items()},
                         speed_ratio_median_paired=statistics.median(pairs)))
    return rows


# --- 3. the demo, trained twice ------------------------------------------------------------

def demo_training(compiled: ModuleType, iters: int, data_root: Path, seed: int) -> dict:
    if not (data_root / 'annotations' / 'instances_val.json').exists():
        make_demo_coco(data_root)
    cfg = load_config(str(CONFIG), None, 'none', str(ROOT / 'work_dirs/benchmark_mmcv_ops'))
    point_at_data_root(cfg, str(data_root))
    for loader in (cfg.train_dataloader, cfg.val_dataloader):
        loader.update(num_workers=0, persistent_workers=False)
    cfg.param_scheduler[-1].end = iters
    extensions = {'compiled': compiled, 'torch-native': torch_native}
    with DefaultScope.overwrite_default_scope('mmdet'):
        torch.manual_seed(seed)
        first = build_model(cfg, 'train')
        first.init_weights()
        runs = {}
        for name in extensions:
            model = build_model(cfg, 'train')
            model.load_state_dict(first.state_dict())
            optim = build_optim_wrapper(model, cfg.optim_wrapper)
            schedulers = [PARAM_SCHEDULERS.build(dict(s, optimizer=optim))
                          for s in cfg.param_scheduler]
            runs[name] = dict(model=model, optim=optim, schedulers=schedulers, times=[],
                              losses=[])
        loader = iter(Runner.build_dataloader(cfg.train_dataloader, seed=seed))
        for step in range(iters):
            batch = next(loader)
            order = list(extensions) if step % 2 == 0 else list(reversed(extensions))
            for name in order:
                run = runs[name]
                with using(extensions[name]), torch.random.fork_rng():
                    torch.manual_seed(seed + step)
                    start = time.perf_counter()
                    log_vars = run['model'].train_step(batch, run['optim'])
                    run['times'].append(time.perf_counter() - start)
                for scheduler in run['schedulers']:
                    scheduler.step()
                run['losses'].append(log_vars['loss'].item())
            if step % 25 == 0 or step == iters - 1:
                print(f'iter {step + 1}/{iters}: loss ' + ', '.join(
                    f"{n} {runs[n]['losses'][-1]:.4f}" for n in runs), flush=True)
        results = {}
        for name, run in runs.items():
            evaluator = Evaluator(cfg.val_evaluator)
            val_loader = Runner.build_dataloader(cfg.val_dataloader, seed=seed)
            evaluator.dataset_meta = val_loader.dataset.metainfo
            run['model'].eval()
            with using(extensions[name]), torch.no_grad():
                for batch in val_loader:
                    evaluator.process(run['model'].val_step(batch), batch)
            metrics = evaluator.evaluate(len(val_loader.dataset))
            times = run['times'][10:]  # the first steps warm up allocators and caches
            results[name] = dict(bbox_mAP=metrics['coco/bbox_mAP'],
                                 segm_mAP=metrics['coco/segm_mAP'],
                                 step_s_median=statistics.median(times),
                                 final_loss=run['losses'][-1])
    pairs = [c / t for c, t in zip(runs['compiled']['times'][10:],
                                   runs['torch-native']['times'][10:])]
    return dict(iters=iters, seed=seed, config=str(CONFIG.relative_to(ROOT)), **results,
                speed_ratio_median_paired=statistics.median(pairs),
                speed_ratio_of_medians=(results['compiled']['step_s_median']
                                        / results['torch-native']['step_s_median']))


# --- 4. the served ops against mmcv's pure-torch paths (no compiled mmcv needed) ---------------

def _deform_attn_case(device: str) -> tuple[list[torch.Tensor], dict]:
    """DINO's encoder at a 512x512 image: 4 levels (strides 8-64), a query per key, 8 heads of
    32 channels, 4 points."""
    gen = torch.Generator().manual_seed(0)
    shapes = torch.tensor([[64, 64], [32, 32], [16, 16], [8, 8]])
    starts = torch.cat([shapes.new_zeros(1), shapes.prod(1).cumsum(0)[:-1]])
    keys = int(shapes.prod(1).sum())
    inputs = [torch.randn(2, keys, 8, 32, generator=gen),
              torch.rand(2, keys, 8, 4, 4, 2, generator=gen),
              torch.rand(2, keys, 8, 4, 4, generator=gen).softmax(-1)]
    return ([t.to(device).requires_grad_() for t in inputs],
            dict(shapes=shapes.to(device), starts=starts.to(device)))


def _focal_case(device: str) -> tuple[list[torch.Tensor], dict]:
    """RetinaNet's classification loss at a 512x512 image: 49,104 anchors x 80 classes."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(49104, 80, generator=gen).to(device).requires_grad_()
    target = torch.randint(0, 81, (49104,), generator=gen).to(device)
    return [logits], dict(target=target, one_hot=torch.nn.functional.one_hot(target, 81)[:, :80])


def _pure_torch_cases() -> dict[str, dict[str, Callable]]:
    """case -> (inputs builder, served step, mmcv's pure-torch step)."""
    from mmcv.ops.multi_scale_deform_attn import (MultiScaleDeformableAttnFunction,
                                                  multi_scale_deformable_attn_pytorch)
    from mmdet.models.losses.focal_loss import py_sigmoid_focal_loss
    import mmcv.ops
    return {
        'ms_deform_attn fwd+bwd (DINO encoder, 512x512)': dict(
            inputs=_deform_attn_case,
            served=lambda t, k: MultiScaleDeformableAttnFunction.apply(
                t[0], k['shapes'], k['starts'], t[1], t[2], 64),
            pure_torch=lambda t, k: multi_scale_deformable_attn_pytorch(
                t[0], k['shapes'], t[1], t[2])),
        'sigmoid_focal_loss fwd+bwd (RetinaNet, 512x512)': dict(
            inputs=_focal_case,
            served=lambda t, k: mmcv.ops.sigmoid_focal_loss(t[0], k['target'], 2.0, 0.25, None,
                                                            'sum'),
            pure_torch=lambda t, k: py_sigmoid_focal_loss(t[0], k['one_hot'], None, 2.0, 0.25,
                                                          'sum')),
    }


def measure_one(case: str, path: str, device: str, repeats: int) -> dict:
    """Median fwd+bwd time and peak memory of one path of one case, in this process: CUDA's
    peak allocation, or on a CPU the rise of the process's peak resident memory over what the
    inputs took (so each path runs in a process of its own)."""
    import resource
    spec = _pure_torch_cases()[case]
    inputs, extra = spec['inputs'](device)
    step = spec[path]
    sync = torch.cuda.synchronize if device == 'cuda' else (lambda: None)
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    times = []
    for _ in range(repeats + 1):
        for t in inputs:
            t.grad = None
        sync()
        start = time.perf_counter()
        out = step(inputs, extra)
        out.backward(torch.ones_like(out))
        sync()
        times.append(time.perf_counter() - start)
    peak = (torch.cuda.max_memory_allocated() if device == 'cuda'
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return dict(case=case, path=path, device=device, step_ms_median=1e3 * statistics.median(
        times[1:]), peak_mib_over_inputs=(peak - base) / 2**20)


def pure_torch_comparison(device: str, repeats: int, only: str = '') -> list[dict]:
    """Each case's two paths (the cases whose name holds ``only``), each in a fresh
    interpreter (see :func:`measure_one`)."""
    import subprocess
    rows = []
    for case in (name for name in _pure_torch_cases() if only in name):
        for path in ('served', 'pure_torch'):
            command = [sys.executable, '-m', 'benchmarks.benchmark_mmcv_ops', '--measure-one',
                       case, path, '--device', device, '--repeats', str(repeats)]
            result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                                    check=True)
            rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    return rows


# --- 5. the served ops against an earlier revision of them (no compiled mmcv needed) --------

def load_revision(rev: str) -> ModuleType:
    """The served ops as they were at git revision ``rev`` of this repository, as a module."""
    import importlib.util
    import subprocess
    import tempfile
    source = subprocess.run(['git', 'show', f'{rev}:vitdense/compat/mmcv_ext.py'], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    with tempfile.TemporaryDirectory(prefix='mmcv_ext_') as folder:
        path = Path(folder) / 'mmcv_ext_at_revision.py'
        path.write_text(source)
        spec = importlib.util.spec_from_file_location('mmcv_ext_at_revision', path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def _soft_nms_case(device: str) -> dict:
    """8,000 boxes of up to 100 px in an 800 px square (mmcv runs soft-NMS on the CPU)."""
    gen = torch.Generator().manual_seed(0)
    corner = torch.rand(8000, 2, generator=gen) * 800
    boxes = torch.cat([corner, corner + torch.rand(8000, 2, generator=gen) * 100 + 5], 1)
    return dict(boxes=boxes, scores=torch.rand(8000, generator=gen))


def _psamask_case(batch: int, feature_hw: tuple[int, int], mask_hw: tuple[int, int]
                  ) -> Callable[[str], dict]:
    """PSANet's collect mask at a config's shape: the mask (N, h_mask * w_mask, H, W)."""
    def build(device: str) -> dict:
        mask = torch.randn(batch, mask_hw[0] * mask_hw[1], *feature_hw, device=device)
        return dict(mask=mask.requires_grad_(), mask_hw=mask_hw)
    return build


def _psamask_step(case: dict, backward: bool) -> torch.Tensor:
    import mmcv.ops
    out = mmcv.ops.PSAMask('collect', case['mask_hw'])(case['mask'])
    if backward:
        out.backward(torch.ones_like(out))
    return out


def _deform_attn_inputs(device: str) -> dict:
    """:func:`_deform_attn_case` as one dict."""
    (value, locations, weights), extra = _deform_attn_case(device)
    return dict(value=value, locations=locations, weights=weights, **extra)


def _deform_attn_step(case: dict) -> torch.Tensor:
    from mmcv.ops.multi_scale_deform_attn import MultiScaleDeformableAttnFunction
    out = MultiScaleDeformableAttnFunction.apply(case['value'], case['shapes'], case['starts'],
                                                 case['locations'], case['weights'], 64)
    out.backward(torch.ones_like(out))
    return out


def _revision_cases() -> dict[str, dict]:
    """case -> (inputs builder, step, the output's size in bytes or None)."""
    import mmcv.ops
    psamask_shapes = {'ADE20K 512x512 (4 images, 64x64 features, 66x66 mask)': (4, (64, 64),
                                                                               (66, 66)),
                      'Cityscapes 512x1024 (2 images, 64x128 features, 97x97 mask)': (
                          2, (64, 128), (97, 97))}
    cases = {'soft_nms linear, 8,000 boxes': dict(
        inputs=_soft_nms_case, output_bytes=None,
        step=lambda c: mmcv.ops.soft_nms(c['boxes'], c['scores'], 0.3, sigma=0.5,
                                         min_score=1e-3, method='linear')[1]),
             'ms_deform_attn fwd+bwd (DINO encoder, 512x512)': dict(
                 inputs=_deform_attn_inputs, output_bytes=None, step=_deform_attn_step)}
    for name, (batch, feature_hw, mask_hw) in psamask_shapes.items():
        output_bytes = 4 * batch * (feature_hw[0] * feature_hw[1]) ** 2
        for backward in (False, True):
            cases[f'PSAMask {"fwd+bwd" if backward else "fwd"}, {name}'] = dict(
                inputs=_psamask_case(batch, feature_hw, mask_hw), output_bytes=output_bytes,
                step=lambda c, b=backward: _psamask_step(c, b))
    return cases


def measure_revision_one(case: str, rev: str | None, device: str, repeats: int) -> dict:
    """Median time and peak memory of one case, served by this tree (``rev`` None) or by
    revision ``rev``, in this process (peak as in :func:`measure_one`)."""
    import resource
    import mmcv.ops  # noqa: F401  (loads mmcv._ext)
    spec = _revision_cases()[case]
    ext = sys.modules['mmcv._ext'] if rev is None else load_revision(rev)
    inputs = spec['inputs'](device)
    sync = torch.cuda.synchronize if device == 'cuda' else (lambda: None)
    if device == 'cuda':
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    times = []
    with using(ext):
        for _ in range(repeats + 1):
            for t in inputs.values():
                if isinstance(t, torch.Tensor):
                    t.grad = None
            sync()
            start = time.perf_counter()
            spec['step'](inputs)
            sync()
            times.append(time.perf_counter() - start)
    peak = (torch.cuda.max_memory_allocated() if device == 'cuda'
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    row = dict(case=case, path=rev or 'served', device=device,
               step_ms_median=1e3 * statistics.median(times[1:]),
               peak_mib_over_inputs=(peak - base) / 2**20)
    if spec['output_bytes']:
        row['peak_over_output'] = (peak - base) / spec['output_bytes']
    return row


def revision_comparison(rev: str, device: str, repeats: int, only: str = '') -> list[dict]:
    """Each case (whose name holds ``only``) served by this tree and by revision ``rev``,
    alternately, each in a fresh interpreter (see :func:`measure_revision_one`)."""
    import subprocess
    rows = []
    for case in (name for name in _revision_cases() if only in name):
        for path in ('served', rev):
            command = [sys.executable, '-m', 'benchmarks.benchmark_mmcv_ops',
                       '--measure-revision-one', case, path, '--device', device,
                       '--repeats', str(repeats)]
            result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                                    check=True)
            rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--iters', type=int, default=150, help='demo training iterations')
    parser.add_argument('--data-root', type=Path, default=ROOT / 'data/demo_coco')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--skip-demo', action='store_true', help='the ops only (1 and 2)')
    parser.add_argument('--out', type=Path, default=ROOT / 'benchmarks/results/mmcv_ops.json')
    parser.add_argument('--pure-torch', action='store_true',
                        help="only 4: the served ops against mmcv's pure-torch paths")
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--repeats', type=int, default=10)
    parser.add_argument('--measure-one', nargs=2, metavar=('CASE', 'PATH'),
                        help=argparse.SUPPRESS)  # one path of 4, in a process of its own
    parser.add_argument('--against', metavar='REV',
                        help='only 5: soft-NMS, deformable attention and PSAMask served by '
                             'this tree and by git revision REV')
    parser.add_argument('--only', default='', metavar='TEXT',
                        help='4 and 5: only the cases whose name holds TEXT')
    parser.add_argument('--measure-revision-one', nargs=2, metavar=('CASE', 'PATH'),
                        help=argparse.SUPPRESS)  # one path of 5, in a process of its own
    args = parser.parse_args()
    if args.measure_one:
        print(json.dumps(measure_one(*args.measure_one, args.device, args.repeats)))
        return
    if args.measure_revision_one:
        case, path = args.measure_revision_one
        print(json.dumps(measure_revision_one(case, None if path == 'served' else path,
                                              args.device, args.repeats)))
        return
    if args.against:
        rows = revision_comparison(args.against, args.device, args.repeats, args.only)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(dict(torch=torch.__version__, against=args.against,
                                            rows=rows), indent=1))
        print(f'wrote {args.out}')
        return
    if args.pure_torch:
        rows = pure_torch_comparison(args.device, args.repeats, args.only)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(dict(torch=torch.__version__, pure_torch=rows), indent=1))
        print(f'wrote {args.out}')
        return
    compiled = compiled_ext()
    report: dict = dict(torch=torch.__version__, threads=torch.get_num_threads())
    report['roi_align'] = roi_align_cases(compiled)
    report['nms'] = nms_cases(compiled)
    report['op_speed'] = op_speed(compiled)
    for row in report['roi_align'] + report['nms'] + report['op_speed']:
        print(json.dumps(row))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    if not args.skip_demo:
        report['demo'] = demo_training(compiled, args.iters, args.data_root, args.seed)
        print(json.dumps(report['demo'], indent=1))
        args.out.write_text(json.dumps(report, indent=1))
    print(f'wrote {args.out}')


if __name__ == '__main__':
    main()
