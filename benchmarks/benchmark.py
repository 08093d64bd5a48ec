"""Backbone speed, memory and FLOPs: every vitdense model against timm on the same weights.

For each case (model, task, input size, batch, mode, attention) both implementations are
built on timm's weights, their outputs compared, then timed in one interleaved loop
(median of repeats after warm-up; also the median of pairwise ratios, and with
``--processes N`` the loop runs in N fresh processes whose samples are pooled), their FLOPs
counted, and their peak memory measured each in a fresh subprocess. Results: a table,
``<out>.json`` and ``<out>.png`` (peak memory and time per image vs number of tokens, as
XCiT's Fig. 2).

    python -m benchmarks.benchmark --models xcit_small_12_p16_224 vit_small_patch16_224 \\
        --tasks dense --sizes 224 448 896 --batches 1 --attention fused explicit
    python -m benchmarks.benchmark --models vit_small_patch16_224 --modes train --compile
    nice python -m benchmarks.benchmark --preset floors       # the cases of docs/benchmarks.md
    python -m benchmarks.benchmark --list                     # model names

Tasks: ``cls`` compares our ``out_type='cls_token'`` with timm's pooled features
(``num_classes=0``); ``dense`` compares our columnar dense maps (``pyramid=False``) with
timm's ``forward_intermediates`` at the same blocks. Models are named by their timm model.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
from pathlib import Path
from typing import Optional

import torch

from benchmarks import benchmark_lib as bm
from benchmarks.benchmark_lib import ROOT
from vitdense.engine.compile import compile_function

#: each family's small model (CaiT: XXS-24, the width of the dense configs, as S-24 would
#: take an hour at 512x512 batch 8 on 2 cores)
SMALL_MODELS = ['vit_small_patch16_224', 'cait_xxs24_224', 'xcit_small_12_p16_224',
                'convit_small']
#: named lists of case grids; each grid is expanded as a product of its lists
PRESETS: dict[str, list[dict]] = {
    # throughput of each family's small model at 224 and 512, batch 1 and 8
    'floors': [
        dict(models=SMALL_MODELS, tasks=['cls', 'dense'], sizes=[224], batches=[1, 8]),
        dict(models=SMALL_MODELS, tasks=['dense'], sizes=[512], batches=[1, 8]),
        # memory vs tokens: XCiT against ViT with fused and explicit attention
        dict(models=['xcit_small_12_p16_224', 'vit_small_patch16_224'], tasks=['dense'],
             sizes=[224, 448, 672, 896], batches=[1], attention=['fused', 'explicit']),
        # "Three things" §3: parallel ViT-S18x2 against sequential ViT-S36
        dict(models=['vit_small_patch16_18x2_224', 'vit_small_patch16_36x1_224'],
             tasks=['cls'], sizes=[224], batches=[1, 8]),
    ],
    'small': [dict(models=SMALL_MODELS, tasks=['cls', 'dense'], sizes=[224], batches=[1])],
    'smoke': [dict(models=['vit_tiny_patch16_224'], tasks=['cls'], sizes=[64], batches=[1])],
}
PROBE = bm.module_command('benchmarks.benchmark', '--probe')
GRID_KEYS = ('models', 'tasks', 'sizes', 'batches', 'modes', 'attention')
#: parallel model -> sequential model with the same blocks ("Three things" §3)
PARALLEL_TWINS = {'vit_small_patch16_18x2_224': 'vit_small_patch16_36x1_224'}


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--models', nargs='+', help="model names (see --list) or 'all'")
    parser.add_argument('--tasks', nargs='+', choices=bm.TASKS)
    parser.add_argument('--sizes', nargs='+', type=int, help='square input sizes')
    parser.add_argument('--batches', nargs='+', type=int)
    parser.add_argument('--modes', nargs='+', choices=bm.MODES,
                        help="'infer': forward without grad; 'train': forward + backward")
    parser.add_argument('--attention', nargs='+', choices=bm.ATTENTIONS,
                        help="'explicit' forces SDPA's math kernel (materialised attention)")
    parser.add_argument('--preset', choices=sorted(PRESETS),
                        help='named case lists; the options above override their fields')
    parser.add_argument('--compile', action='store_true',
                        help='also benchmark torch.compile of both models')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--threads', type=int, default=bm.default_threads(),
                        help='torch threads, the same for every model and subprocess')
    parser.add_argument('--warmup', type=int, default=1,
                        help='untimed rounds after the numerical check (itself a warm-up)')
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--min-repeat-s', type=float, default=0.3,
                        help='each timing sample repeats a step to last about this long')
    parser.add_argument('--processes', type=int, default=1,
                        help='time each case in this many fresh processes (alternating which '
                             'model is built first: use an even number), --repeats samples '
                             "each, pooled: where a process's buffers land in memory shifts "
                             'its ratio by a few %%')
    parser.add_argument('--no-memory', action='store_true', help='skip memory subprocesses')
    parser.add_argument('--no-flops', action='store_true')
    parser.add_argument('--out', type=Path, default=ROOT / 'benchmarks/results/backbones',
                        help='output path without suffix: <out>.json and <out>.png')
    parser.add_argument('--list', action='store_true', help='list model names and exit')
    parser.add_argument('--probe', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        parser.error('--device cuda: no CUDA device is available')
    return args


def expand_cases(args: argparse.Namespace) -> list[bm.Case]:
    """The cases of the preset (or of one grid from the options), in order, once each."""
    defaults = dict(models=None, tasks=['cls'], sizes=[224], batches=[1], modes=['infer'],
                    attention=['fused'])
    grids = PRESETS[args.preset] if args.preset else [{}]
    specs = bm.backbone_specs()
    cases: list[bm.Case] = []
    for grid in grids:
        grid = {key: getattr(args, key) or grid.get(key) or defaults[key] for key in GRID_KEYS}
        if grid['models'] is None:
            raise SystemExit('choose --models (or --preset); --list shows the names')
        models = list(specs) if grid['models'] == ['all'] else grid['models']
        unknown = [m for m in models if m not in specs]
        if unknown:
            raise SystemExit(f'unknown models {unknown}; --list shows the names')
        for model, task, size, batch, mode, attention in itertools.product(
                models, *(grid[key] for key in GRID_KEYS[1:])):
            case = bm.Case(model, task, size, batch, mode, attention)
            if case not in cases:
                cases.append(case)
    return cases


def build_inputs(case: bm.Case, device: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(case.batch, 3, case.img_size, case.img_size, generator=generator)
    return images.to(device)


def build_models(case: bm.Case, args: argparse.Namespace,
                 reference_first: bool = False) -> dict[str, torch.nn.Module]:
    """Both implementations of a case on the device (and their compiled variants)."""
    spec = bm.backbone_specs()[case.model]
    models = {name: model.to(args.device) for name, model in bm.build_backbone_pair(
        spec, case.task, case.img_size, reference_first=reference_first).items()}
    if args.compile:
        models.update({f'{name}+compile': compile_function(model)
                       for name, model in list(models.items())})
    return models


def time_models(case: bm.Case, models: dict[str, torch.nn.Module],
                args: argparse.Namespace) -> dict[str, list[float]]:
    inputs = build_inputs(case, args.device)
    steps = {name: bm.make_step(model, inputs, case.mode, case.attention)
             for name, model in models.items()}
    return bm.time_interleaved(steps, args.warmup, args.repeats, args.min_repeat_s,
                               bm.synchronizer(args.device))


def time_in_processes(case: bm.Case, args: argparse.Namespace) -> dict[str, list[list[float]]]:
    """Samples of every implementation from ``args.processes`` fresh processes, each
    building both models (timm's first in every other one); one list per process."""
    samples: dict[str, list[list[float]]] = {}
    for index in range(args.processes):
        spec = dict(case.as_dict(), measure='time', device=args.device, threads=args.threads,
                    reference_first=index % 2 == 1, compile=args.compile,
                    warmup=args.warmup, repeats=args.repeats, min_repeat_s=args.min_repeat_s)
        result = bm.run_probe(PROBE, spec)
        if 'probe_error' in result:
            raise RuntimeError(f'timing process {index} of {case}: {result["probe_error"]}')
        for name, values in result.items():
            samples.setdefault(name, []).append(values)
    return samples


def run_case(case: bm.Case, args: argparse.Namespace) -> dict:
    """Numerics and FLOPs in this process; times here or in ``args.processes`` fresh
    processes; memory in one subprocess per model."""
    spec = bm.backbone_specs()[case.model]
    models = build_models(case, args)
    inputs = build_inputs(case, args.device)
    record = dict(case.as_dict(), timm_name=spec.timm_name,
                  tokens=math.ceil(case.img_size / spec.patch_size) ** 2,
                  max_abs_diff=bm.max_abs_difference(models, inputs))
    impls: dict[str, dict] = {name: {} for name in models}
    if not args.no_flops:  # per image, counted on the first one
        for name, model in models.items():
            if not name.endswith('+compile'):
                step = bm.make_step(model, inputs[:1], case.mode, case.attention)
                impls[name]['gflops'] = bm.count_flops(step) / 1e9
    if args.processes > 1:  # every timing process builds its own models
        per_process = time_in_processes(case, args)
    else:
        per_process = {name: [samples] for name, samples in
                       time_models(case, models, args).items()}
    del models
    for name, runs in per_process.items():
        impls[name].update(bm.summarize_times([t for run in runs for t in run], case.batch))
    if not args.no_memory:
        for name in impls:
            probe = dict(case.as_dict(), impl=name, device=args.device, threads=args.threads)
            impls[name].update(bm.probe_memory(PROBE, probe))
    record['impls'] = impls
    for suffix in ('', '+compile'):
        ours, ref = impls.get(bm.OURS + suffix), impls.get(bm.TIMM + suffix)
        if ours and ref:
            record[f'speed_ratio{suffix}'] = bm.ratio(ours['images_per_s'],
                                                      ref['images_per_s'])
            record[f'speed_ratio_paired{suffix}'] = bm.paired_ratio(ref['samples_s'],
                                                                    ours['samples_s'])
            record[f'speed_ratio_per_process{suffix}'] = [
                bm.ratio(statistics.median(r), statistics.median(o)) for o, r in
                zip(per_process[bm.OURS + suffix], per_process[bm.TIMM + suffix])]
            record[f'memory_ratio{suffix}'] = bm.ratio(ours.get('memory_mb'),
                                                       ref.get('memory_mb'))
    return record


def probe(spec_json: str) -> None:
    """Child process: time both implementations (``measure='time'``) or build one alone
    and report its peak memory."""
    spec = json.loads(spec_json)
    torch.set_num_threads(spec['threads'])
    case = bm.Case(**{key: spec[key] for key in bm.Case.__dataclass_fields__})
    if spec.get('measure') == 'time':
        options = argparse.Namespace(device=spec['device'], compile=spec['compile'],
                                     warmup=spec['warmup'], repeats=spec['repeats'],
                                     min_repeat_s=spec['min_repeat_s'])
        models = build_models(case, options, reference_first=spec['reference_first'])
        bm.report_probe(time_models(case, models, options))
        return
    meter = bm.MemoryMeter(spec['device'])
    backbone = bm.backbone_specs()[case.model]
    impl = spec['impl'].removesuffix('+compile')
    torch.manual_seed(0)
    if impl == bm.OURS:
        model = bm.build_ours(backbone, case.task, case.img_size)
    else:
        model = bm.build_timm(backbone, case.task, case.img_size)
    model = model.to(spec['device'])
    if spec['impl'].endswith('+compile'):
        model = compile_function(model)
    step = bm.make_step(model, build_inputs(case, spec['device']), case.mode, case.attention)
    bm.report_probe(meter.measure(step))


# ---------------------------------------------------------------------- reports
def _fmt(value: Optional[float], digits: int = 1) -> str:
    return '-' if value is None else f'{value:.{digits}f}'


def _range(values: Optional[list[float]]) -> str:
    """min-max of per-process ratios ('-' for a single process)."""
    if not values or len(values) < 2:
        return '-'
    return f'{min(values):.2f}-{max(values):.2f}'


def results_table(results: list[dict]):
    """One row per case and variant (eager, compiled): speeds, memory, FLOPs, difference."""
    from rich.table import Table

    table = Table(title='vitdense vs timm (same weights)', show_lines=False)
    for column in ('model', 'task', 'mode', 'size', 'batch', 'attn', 'variant',
                   'ours img/s', 'timm img/s', 'speed o/t', 'paired o/t', 'processes o/t',
                   'ours MiB', 'timm MiB',
                   'mem o/t', 'GFLOP/img o', 'GFLOP/img t', 'max|Δ|'):
        table.add_column(column, justify='left' if column in ('model', 'variant') else 'right',
                         no_wrap=column == 'model')
    for record in results:
        for suffix in ('', '+compile'):
            ours = record['impls'].get(bm.OURS + suffix)
            if ours is None:
                continue
            ref = record['impls'].get(bm.TIMM + suffix, {})
            table.add_row(
                record['model'], record['task'], record['mode'], str(record['img_size']),
                str(record['batch']), record['attention'], suffix.lstrip('+') or 'eager',
                _fmt(ours.get('images_per_s')), _fmt(ref.get('images_per_s')),
                _fmt(record.get('speed_ratio' + suffix), 2),
                _fmt(record.get('speed_ratio_paired' + suffix), 2),
                _range(record.get('speed_ratio_per_process' + suffix)),
                _fmt(ours.get('memory_mb'), 0), _fmt(ref.get('memory_mb'), 0),
                _fmt(record.get('memory_ratio' + suffix), 2),
                _fmt(ours.get('gflops')), _fmt(ref.get('gflops')),
                '-' if record['max_abs_diff'] is None else f"{record['max_abs_diff']:.1e}")
    return table


def memory_growth(results: list[dict]) -> list[dict]:
    """For every line (model, implementation, task, mode, batch, attention) measured at
    several sizes: peak memory at 4x (and 16x) the tokens of its smallest size, as a ratio."""
    lines: dict[tuple, dict[int, dict]] = {}
    for record in results:
        for impl, values in record['impls'].items():
            key = (record['model'], impl, record['task'], record['mode'], record['batch'],
                   record['attention'])
            lines.setdefault(key, {})[record['tokens']] = values
    growth = []
    for (model, impl, task, mode, batch, attention), by_tokens in lines.items():
        base = min(by_tokens)
        for factor in (4, 16):
            if base * factor not in by_tokens:
                continue
            low, high = by_tokens[base], by_tokens[base * factor]
            growth.append(dict(
                model=model, impl=impl, task=task, mode=mode, batch=batch, attention=attention,
                tokens=(base, base * factor), factor=factor,
                memory_mb=(low.get('memory_mb'), high.get('memory_mb')),
                memory_ratio=bm.ratio(high.get('memory_mb'), low.get('memory_mb')),
                activation_ratio=bm.ratio(high.get('activation_mb'), low.get('activation_mb')),
                time_ratio=bm.ratio(high.get('ms_per_image'), low.get('ms_per_image'))))
    return growth


def growth_table(growth: list[dict]):
    from rich.table import Table

    table = Table(title='memory growth with tokens (batch as measured)')
    for column in ('model', 'impl', 'task', 'mode', 'batch', 'attn', 'tokens', 'MiB',
                   'memory ×', 'activations ×', 'time/img ×'):
        table.add_column(column, justify='left' if column in ('model', 'impl') else 'right')
    for row in growth:
        low, high = row['memory_mb']
        table.add_row(row['model'], row['impl'], row['task'], row['mode'], str(row['batch']),
                      row['attention'], f"{row['tokens'][0]}→{row['tokens'][1]}",
                      f'{_fmt(low, 0)}→{_fmt(high, 0)}', _fmt(row['memory_ratio'], 2),
                      _fmt(row['activation_ratio'], 2), _fmt(row['time_ratio'], 2))
    return table


def parallel_vs_sequential(results: list[dict]) -> list[dict]:
    """"Three things" §3: latency of each parallel model against its sequential twin
    (same blocks and FLOPs) in the same setting, for every implementation."""
    by_case = {(r['model'], r['task'], r['img_size'], r['batch'], r['mode'], r['attention']): r
               for r in results}
    rows = []
    for (model, *setting), record in by_case.items():
        twin = by_case.get((PARALLEL_TWINS.get(model), *setting))
        if twin is None:
            continue
        for impl, values in record['impls'].items():
            if impl in twin['impls']:
                parallel, sequential = values['step_s'], twin['impls'][impl]['step_s']
                rows.append(dict(parallel=model, sequential=twin['model'], impl=impl,
                                 task=setting[0], img_size=setting[1], batch=setting[2],
                                 mode=setting[3], parallel_ms=1e3 * parallel,
                                 sequential_ms=1e3 * sequential,
                                 ratio=parallel / sequential))
    return rows


def parallel_table(rows: list[dict]):
    from rich.table import Table

    table = Table(title='parallel vs sequential blocks: latency per batch')
    for column in ('parallel', 'sequential', 'impl', 'task', 'mode', 'size', 'batch',
                   'parallel ms', 'sequential ms', 'par / seq'):
        table.add_column(column, justify='left' if column in ('parallel', 'sequential', 'impl')
                         else 'right')
    for row in rows:
        table.add_row(row['parallel'], row['sequential'], row['impl'], row['task'],
                      row['mode'], str(row['img_size']), str(row['batch']),
                      _fmt(row['parallel_ms']), _fmt(row['sequential_ms']),
                      _fmt(row['ratio'], 3))
    return table


def speed_summary(results: list[dict]) -> dict:
    """Worst eager speed ratio ours/timm per model over all its cases."""
    worst: dict[str, float] = {}
    for record in results:
        value = record.get('speed_ratio')
        if value is not None:
            worst[record['model']] = min(value, worst.get(record['model'], value))
    return worst


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    if args.probe:
        probe(args.probe)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    if args.list:
        for name, spec in bm.backbone_specs().items():
            print(f'{name:36s} {spec.family:7s} {spec.arch:10s} {spec.options or ""}')
        return
    torch.set_num_threads(args.threads)
    cases = expand_cases(args)
    console = Console(width=max(Console().width, 200))
    meta = bm.environment(args.device, args.threads)
    results = []
    columns = ('[progress.description]{task.description}', BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task('benchmark', total=len(cases))
        for case in cases:
            progress.update(task, description=f'{case.model} {case.task} {case.mode} '
                                              f'{case.img_size}px b{case.batch} '
                                              f'{case.attention}')
            results.append(run_case(case, args))
            # written after every case: a long run stopped early keeps what it measured
            bm.write_json(args.out.with_suffix('.json'), dict(meta, complete=False), results)
            progress.advance(task)
    meta['load_average_end'] = list(os.getloadavg())
    growth = memory_growth(results)
    parallel = parallel_vs_sequential(results)
    summary = dict(worst_speed_ratio=speed_summary(results), memory_growth=growth,
                   parallel_vs_sequential=parallel)
    console.print(results_table(results))
    if growth:
        console.print(growth_table(growth))
    if parallel:
        console.print(parallel_table(parallel))
    bm.write_json(args.out.with_suffix('.json'), dict(meta, complete=True, summary=summary),
                  results)
    plot = bm.plot_scaling(results, args.out.with_suffix('.png'),
                           title=f"{meta['cpu'] if args.device == 'cpu' else meta.get('gpu')}, "
                                 f'{args.threads} threads')
    console.print(f"worst speed ratio ours/timm per model: "
                  f"{ {k: round(v, 2) for k, v in summary['worst_speed_ratio'].items()} }")
    console.print(f"wrote {args.out.with_suffix('.json')}" + (f' and {plot}' if plot else ''))


if __name__ == '__main__':
    main()
