"""The GPU report in one command: how much of the machine our training steps use.

    python -m benchmarks.gpu_report [--out work_dirs/gpu_report.json] [--docs docs/gpu_report.md]
        [--models vit_base_patch16_224 ...] [--overhead] [--budget-s 540]

On a CUDA device, within one ``--budget-s`` run (cases past the budget are recorded as
skipped):

- the matrix-product rate (8192² bf16 and fp16 matmuls), measured beside the steps;
- per family (``--models``: timm names; default one S model per family and ViT-B): the
  backbone's training step (forward, a scalar loss over the outputs, backward) at 224²
  batch 64 under bf16 autocast, ours against the same model from timm, and ours alone at
  2 × 800 × 1344 under fp16 autocast; each eager and ``torch.compile``-d (first compiled
  step = compile time), as a share of the matmul rate (counted FLOPs / step time / rate);
- one Mask R-CNN and one UperNet step at their configs' real input and batch with the
  config's own optimizer wrapper: real peak memory (``max_memory_allocated``) beside our
  memory account (``vitdense.analysis.memory``), and mmdet's ResNet-50 Mask R-CNN as the
  anchor;
- ``--overhead``: what CUDA graphs (``mode='reduce-overhead'``) and a fused AdamW give for
  the fixed-size 224² classification step of the first model.

Writes a JSON results file and a Markdown table with the device and versions. Without a
GPU the same code runs small (one tiny arch per family, tiny inputs, one repetition, the
``aot_eager`` backend, which needs no C++ build): a check that the report works, not a
measurement.
"""
from __future__ import annotations

import argparse
import glob
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn

from benchmarks.benchmark_lib import (OURS, TIMM, BackboneSpec, build_backbone_pair,
                                      count_flops, environment, first_call_s, make_step,
                                      synchronizer, time_interleaved, write_json)
from vitdense.engine.compile import compile_function

DEFAULT_MODELS = ('vit_small_patch16_224', 'vit_base_patch16_224', 'cait_xxs24_224',
                  'xcit_small_12_p16_224', 'convit_small')
DENSE_CONFIGS = ('configs/xcit/mask-rcnn_xcit-s12-p16_fpn_3x_coco.py',
                 'configs/xcit/upernet_xcit-s12-p16_8xb2-160k_ade20k-512x512.py')
SMALL_DENSE_CONFIGS = ('configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py',
                       'configs/xcit/upernet_xcit-d6-p8_demo-ade.py')
ANCHOR = 'mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
TINY_ARCH = dict(embed_dims=32, num_layers=4, num_heads=2)  # 4 blocks: the pyramid's 4 outputs


@dataclass(frozen=True)
class Setting:
    """One size of the run: how the backbone and dense steps are sized and compiled."""

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


GPU = Setting('cuda', 64, 224, 2, (800, 1344), 'inductor', 5, 2, 8192, DENSE_CONFIGS, None)
CPU = Setting('cpu', 1, 32, 1, (32, 64), 'aot_eager', 1, 1, 256, SMALL_DENSE_CONFIGS, (64, 96))


def half_types(setting: Setting) -> dict[str, torch.dtype]:
    """The autocast types of the two backbone steps (on CPU both bf16: no fp16 autocast)."""
    if setting.device == 'cpu':
        return dict(cls=torch.bfloat16, dense=torch.bfloat16)
    return dict(cls=torch.bfloat16, dense=torch.float16)


def matmul_rate(setting: Setting, dtype: torch.dtype) -> float:
    """FLOP/s of an n × n matmul in ``dtype`` (2 FLOPs per multiply-add)."""
    n = setting.gemm_size
    a, b = (torch.randn(n, n, device=setting.device, dtype=dtype) for _ in range(2))
    seconds = min(time_interleaved({'mm': lambda: a @ b}, warmup=setting.warmup,
                                   repeats=setting.repeats,
                                   sync=synchronizer(setting.device))['mm'])
    return 2 * n ** 3 / seconds


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


def measure_backbone(spec: BackboneSpec, task: str, setting: Setting, rate: float,
                     overhead: bool) -> dict:
    """Eager and compiled training steps of ours (and timm's for the 224² task)."""
    device, dtype = setting.device, half_types(setting)[task]
    if task == 'cls':
        size, batch = setting.cls_size, setting.cls_batch
        models = build_backbone_pair(spec, 'dense', size)
    else:
        size, batch = setting.dense_size, setting.dense_batch
        models = {OURS: build_backbone_pair(replace(spec, timm_name=None), 'dense', size)[OURS]}
    images = torch.randn(batch, 3, *((size, size) if isinstance(size, int) else size),
                         device=device)
    steps, record = {}, dict(model=spec.name, task=task, batch=batch,
                             input=list(images.shape[2:]), dtype=str(dtype).split('.')[-1])
    for name, model in models.items():
        model.to(device).train()
        steps[f'{name} eager'] = make_step(model, images, 'train', dtype=dtype)
        compiled = compile_function(model, setting.backend)
        steps[f'{name} compiled'] = make_step(compiled, images, 'train', dtype=dtype)
        record[f'{name} compile_s'] = first_call_s(steps[f'{name} compiled'], device)
    if overhead and task == 'cls' and device == 'cuda':
        graphs = compile_function(models[OURS], mode='reduce-overhead')
        steps[f'{OURS} cudagraphs'] = make_step(graphs, images, 'train', dtype=dtype)
        record[f'{OURS} cudagraphs compile_s'] = first_call_s(steps[f'{OURS} cudagraphs'],
                                                              device)
        steps[f'{OURS} compiled + fused AdamW'] = _with_fused_adamw(
            models[OURS], steps[f'{OURS} compiled'])
    flops = count_flops(steps[f'{OURS} eager'])
    samples = time_interleaved(steps, warmup=setting.warmup, repeats=setting.repeats,
                               sync=synchronizer(device))
    record['gflop_step'] = flops / 1e9
    for name, times in samples.items():
        seconds = sorted(times)[len(times) // 2]
        record[f'{name} ms'] = 1e3 * seconds
        record[f'{name} share'] = flops / seconds / rate
    return record


def _with_fused_adamw(model: nn.Module, step: Callable[[], None]) -> Callable[[], None]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step_and_update() -> None:
        step()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step_and_update


def measure_dense(config: str, setting: Setting) -> dict:
    """One training step of ``config`` with its own optimizer wrapper: time, real peak
    memory (CUDA) and the memory account of the same input."""
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import DefaultScope

    from vitdense.analysis import memory
    from vitdense.engine.hosts import build_model

    cfg = memory.load_config(config)
    shape = setting.dense_shape or memory.largest_training_input(cfg)
    batch = cfg.train_dataloader.batch_size
    account = memory.account(config, batch=batch, shape=shape)
    amp = memory.uses_amp(cfg)
    cuda = setting.device == 'cuda'
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    model = build_model(cfg, 'train', device=setting.device).train()
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    images = torch.randn(batch, 3, *shape, device=setting.device)
    if cfg.default_scope == 'mmseg':
        samples = memory._seg_samples(batch, shape, model.decode_head.num_classes,
                                      setting.device)
    else:
        samples = [s.to(setting.device) for s in memory._det_samples(
            batch, shape, 8, model.roi_head.bbox_head.num_classes)]

    def step() -> None:
        with wrapper.optim_context(model):
            losses = model.loss(images, samples)
        parsed, _ = model.parse_losses(losses)
        wrapper.update_params(parsed)
    step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    seconds = min(time_interleaved({'step': step}, warmup=1, repeats=setting.repeats,
                                   sync=synchronizer(setting.device))['step'])
    predicted = account['amp' if amp else 'fp32']['peak']
    record = dict(config=os.path.basename(config), batch=batch, input=list(shape), amp=amp,
                  optim_wrapper=type(wrapper).__name__, step_ms=1e3 * seconds,
                  account_gib=predicted / 2 ** 30)
    if cuda:
        real = torch.cuda.max_memory_allocated() - base
        record.update(real_gib=real / 2 ** 30, real_over_account=real / predicted)
    return record


def anchor_config() -> str:
    """mmdet's own ResNet-50 Mask R-CNN config (installed with mmdet)."""
    import mmdet
    return glob.glob(os.path.join(os.path.dirname(mmdet.__file__), '.mim', 'configs', ANCHOR))[0]


def run(setting: Setting, models: tuple[str, ...], budget_s: float, overhead: bool,
        log: Callable[[dict], None] = print) -> tuple[dict, list[dict]]:
    """Every case of the report in order, each recorded (or its error, or 'skipped' once
    the budget is spent)."""
    from vitdense.compat import apply_host_fixes
    apply_host_fixes()
    start = time.perf_counter()
    meta = environment(setting.device, torch.get_num_threads())
    meta.update(versions(), backend=setting.backend, budget_s=budget_s)
    rates = {task: matmul_rate(setting, dtype) for task, dtype in half_types(setting).items()}
    meta['matmul_tflops'] = {task: rate / 1e12 for task, rate in rates.items()}
    cases: list[tuple[str, Callable[[], dict]]] = []
    for spec in backbone_specs(models, setting):
        for task in ('cls', 'dense'):
            cases.append((f'backbone {spec.name} {task}', lambda s=spec, t=task: measure_backbone(
                s, t, setting, rates[t], overhead and s.name == models[0])))
    for config in (*setting.dense_configs, anchor_config()):
        cases.append((f'step {os.path.basename(config)}', lambda c=config: measure_dense(
            c, setting)))
    results = []
    for name, measure in cases:
        if time.perf_counter() - start > budget_s:
            record = dict(case=name, skipped=f'past the {budget_s:.0f} s budget')
        else:
            case_start = time.perf_counter()
            try:
                record = dict(case=name, **measure())
            except Exception as error:  # one case's failure is recorded, the rest go on
                record = dict(case=name, error=repr(error)[:300])
            record['case_s'] = time.perf_counter() - case_start
        results.append(record)
        log(record)
        torch._dynamo.reset()
        if setting.device == 'cuda':
            torch.cuda.empty_cache()
    meta['wall_s'] = time.perf_counter() - start
    return meta, results


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


def _cell(key: str, value) -> str:
    """Shares as percentages, other numbers to 3 digits."""
    if value is None:
        return ''
    if isinstance(value, float):
        return f'{100 * value:.1f} %' if key.endswith(('share', 'over_account')) else \
            f'{value:.3g}'
    return str(value)


def markdown(meta: dict, results: list[dict]) -> str:
    """The report as a Markdown page: environment, then one table per kind of case."""
    lines = ['# GPU report', '',
             'Made by `python -m benchmarks.gpu_report` (see its docstring); shares are counted '
             'FLOPs (2 per multiply-add) / step time / the matmul rate measured in the same '
             'run.', '',
             ', '.join(f'{k} {meta[k]}' for k in (
                 'device', 'gpu', 'cpu', 'torch', 'cuda', 'timm', 'mmdet', 'mmseg',
                 'mmpretrain', 'backend', 'date') if k in meta) + '.', '',
             'Matmul rate (TFLOP/s): ' + ', '.join(
                 f'{k} {v:.1f}' for k, v in meta['matmul_tflops'].items()), '']
    for kind in ('backbone', 'step'):
        rows = [r for r in results if r['case'].startswith(kind)]
        keys = [k for r in rows for k in r if k != 'case']
        columns = list(dict.fromkeys(keys))
        lines += ['| case | ' + ' | '.join(columns) + ' |', '|---' * (len(columns) + 1) + '|']
        lines += ['| ' + ' | '.join([r['case'].split(' ', 1)[1]] + [
            _cell(c, r.get(c)) for c in columns]) + ' |' for r in rows]
        lines.append('')
    return '\n'.join(lines)


def main(argv: Optional[list[str]] = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default='work_dirs/gpu_report.json', type=Path)
    parser.add_argument('--docs', default=None, type=Path,
                        help='also write the Markdown table here (e.g. docs/gpu_report.md)')
    parser.add_argument('--models', nargs='+', default=DEFAULT_MODELS, metavar='TIMM_NAME')
    parser.add_argument('--overhead', action='store_true',
                        help='also CUDA graphs and fused AdamW for the first model at 224²')
    parser.add_argument('--budget-s', type=float, default=540.)
    parser.add_argument('--device', choices=['cuda', 'cpu'],
                        default='cuda' if torch.cuda.is_available() else 'cpu')
    args = parser.parse_args(argv)
    setting = GPU if args.device == 'cuda' else CPU
    meta, results = run(setting, tuple(args.models), args.budget_s, args.overhead)
    write_json(args.out, meta, results)
    if args.docs:
        args.docs.parent.mkdir(parents=True, exist_ok=True)
        args.docs.write_text(markdown(meta, results))
    return dict(meta=meta, results=results)


if __name__ == '__main__':
    main()
