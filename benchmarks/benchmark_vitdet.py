"""ViTDet's layout against the multi-layer pyramid, per family, on the demo sets and at 1024².

Three layouts (window attention only where a family has token attention; XCiT's XCA is linear
in tokens and keeps global attention):

- ``multilayer``: the XCiT paper's multi-layer pyramid (and mmdet's FPN in Mask R-CNN), global
  attention: the ``*_fpn_*`` / ``upernet_*`` configs;
- ``simple-global``: ViTDet's simple feature pyramid from the last block, global attention: the
  ``*_vitdet_*`` configs with ``window_size=0, use_rel_pos=False``;
- ``simple-window``: the ``*_vitdet_*`` configs as shipped: windows in most blocks, a few global
  ones, decomposed relative positions.

``train`` runs every (task, family, layout, seed) cell on the demo sets: the demo config trained
from scratch for a fixed number of iterations (the demo schedule's warmup, then linear decay to
zero over that length) with ``randomness.seed`` set, then evaluated once with the real
evaluators (COCO bbox / segm mAP, mIoU). Each cell is its own process with one torch thread;
``--jobs`` run at a time; rows are appended to ``vitdet_demo.jsonl`` and cells already there are
skipped, so an interrupted sweep goes on where it stopped. ``cost`` measures the full-size Mask
R-CNN configs at 1024² (batch 1, float32): the training memory account of
``vitdense.analysis.memory`` and the time of a real step on this CPU, layouts interleaved.
``table`` prints both as Markdown, each demo cell the mean ± sample std of its seeds::

    nice python -m benchmarks.benchmark_vitdet train --seeds 0 1 2 --jobs 2
    nice python -m benchmarks.benchmark_vitdet cost --repeats 2
    python -m benchmarks.benchmark_vitdet table
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.benchmark_dense_demo import (METRICS, ROOT, demo_config, ensure_data,
                                              train_and_test)
from vitdense.models import backbone_families

FAMILIES = tuple(backbone_families())
#: families whose attention is over tokens, and so can be windowed
WINDOWED = tuple(name for name, family in backbone_families().items() if family.token_attention)
#: layout -> (the demo benchmark's layout, options on top of its config)
LAYOUTS = {
    'multilayer': ('multilayer', {}),
    'simple-global': ('vitdet', {'model.backbone.window_size': 0,
                                 'model.backbone.use_rel_pos': False}),
    'simple-window': ('vitdet', {}),
}
#: the full-size model of each family that ``cost`` measures, in both layouts' Mask R-CNN
FULL_SIZE = {'vit': 'vit-b-p16', 'cait': 'cait-s24-p16', 'convit': 'convit-s-p16',
             'xcit': 'xcit-s12-p16'}
DEFAULT_ITERS = {'det': 100, 'seg': 120}


def layouts_of(family: str) -> tuple[str, ...]:
    """The layouts ``family`` is compared in."""
    return tuple(LAYOUTS) if family in WINDOWED else ('multilayer', 'simple-global')


def layout_options(family: str, layout: str) -> dict:
    """Config options of ``layout`` for ``family`` (XCiT's ViTDet configs are global already)."""
    return {} if family not in WINDOWED else LAYOUTS[layout][1]


def train_for_iterations(cfg, iters: int) -> None:
    """Rewrite the demo schedule in ``cfg`` to ``iters`` iterations: the schedulers that ended
    at the recipe's last iteration end at ``iters``, one evaluation and one checkpoint at the
    end."""
    last = cfg.train_cfg.max_iters
    if iters <= max(s.get('end', 0) for s in cfg.param_scheduler if s.get('end') != last):
        raise ValueError(f'{iters} iterations do not reach past the warmup of the schedule')
    cfg.train_cfg.update(max_iters=iters, val_interval=iters)
    for scheduler in cfg.param_scheduler:
        if scheduler.get('end') == last:
            scheduler.end = iters
    cfg.default_hooks.checkpoint.update(interval=iters, max_keep_ckpts=1)


def cell_config(task: str, family: str, layout: str, seed: int, iters: int, work_dir: Path):
    """The demo config of one cell."""
    cfg = demo_config(task, family, work_dir, layout_options(family, layout) or None,
                      layout=LAYOUTS[layout][0])
    train_for_iterations(cfg, iters)
    cfg.randomness = dict(seed=seed)
    return cfg


def run_cell(task: str, family: str, layout: str, seed: int, iters: int,
             work_dir: Path) -> dict:
    """Train and evaluate one cell in this process, on one torch thread; return its row."""
    cfg = cell_config(task, family, layout, seed, iters, work_dir)
    return dict(task=task, family=family, layout=layout, seed=seed,
                **train_and_test(cfg, task, threads=1))


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def train(args: argparse.Namespace) -> None:
    """Every missing cell, ``args.jobs`` processes at a time."""
    ensure_data()
    results = args.out / 'vitdet_demo.jsonl'
    args.out.mkdir(parents=True, exist_ok=True)
    done = {(r['task'], r['family'], r['layout'], r['seed'], r['iters'])
            for r in read_rows(results)}
    cells = [(task, family, layout, seed)  # seed by seed, so a partial sweep covers every cell
             for seed, task, family in itertools.product(args.seeds, args.tasks, args.families)
             for layout in layouts_of(family) if layout in args.layouts
             and (task, family, layout, seed, args.iters[task]) not in done]

    def launch(cell: tuple) -> None:
        task, family, layout, seed = cell
        command = [sys.executable, '-m', 'benchmarks.benchmark_vitdet', '--out', str(args.out),
                   'one', task, family, layout, str(seed), str(args.iters[task])]
        log = args.out / 'vitdet_demo' / f'{task}_{family}_{layout}_{seed}.log'
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, 'w') as f:
            code = subprocess.run(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT).returncode
        print(f'{task} {family} {layout} seed {seed}: ' + ('done' if code == 0 else
              f'failed with exit {code}, see {log}'), flush=True)

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(launch, cells))


def one(args: argparse.Namespace) -> None:
    """One cell, appended to the results (the file is opened in append mode once per row)."""
    work_dir = args.out / 'vitdet_demo' / f'{args.task}_{args.family}_{args.layout}_{args.seed}'
    row = run_cell(args.task, args.family, args.layout, args.seed, args.iters_one, work_dir)
    with open(args.out / 'vitdet_demo.jsonl', 'a') as f:
        f.write(json.dumps(row) + '\n')


def full_size_config(family: str, layout: str) -> tuple[str, dict]:
    """The full-size Mask R-CNN config of ``family`` in ``layout`` and its options; no block
    recomputes its activations (``with_cp=False``), so layouts are compared as they are."""
    model = FULL_SIZE[family]
    name = (f'mask-rcnn_{model}_fpn_3x_coco.py' if layout == 'multilayer' else
            f'mask-rcnn_{model}_vitdet_16xb4-lsj-100e_coco-1024x1024.py')
    return (str(ROOT / 'configs' / family / name),
            {'model.backbone.with_cp': False, **layout_options(family, layout)})


def cost(args: argparse.Namespace) -> None:
    """Memory account and step time at 1024² of every (family, layout), interleaved."""
    import torch

    from vitdense.analysis.memory import account, time_step
    torch.set_num_threads(args.threads)
    configs = {(family, layout): full_size_config(family, layout)
               for family in args.families for layout in layouts_of(family)}
    rows = {cell: dict(family=cell[0], layout=cell[1], step_s=[]) for cell in configs}
    for (family, layout), (config, options) in configs.items():
        result = account(config, batch=1, shape=(1024, 1024), amp=False, overrides=options)
        rows[family, layout].update(config=config, params=result['params'] // 4,  # fp32 bytes
                                    peak=result['fp32']['peak'],
                                    activations=result['fp32']['activations'])
    for _ in range(args.repeats):
        for (family, layout), (config, options) in configs.items():
            seconds = time_step(config, 1, (1024, 1024), overrides=options)
            rows[family, layout]['step_s'].append(seconds)
            print(f'{family} {layout}: {seconds:.1f} s', flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / 'vitdet_cost.jsonl', 'a') as f:
        for row in rows.values():
            f.write(json.dumps(dict(row, threads=args.threads)) + '\n')


def mean_std(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    """'mean ± sample std' of ``values`` times ``scale`` (the value alone for one run)."""
    values = [v * scale for v in values]
    if len(values) == 1:
        return f'{values[0]:.{digits}f}'
    return f'{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}'


def demo_table(rows: list[dict]) -> str:
    """Per family and layout: each task's metrics as mean ± std over the seeds, seeds listed."""
    lines = ['| family | layout | seeds | COCO demo: box AP | mask AP | ADE demo: mIoU '
             '| iterations det / seg | train CPU s / iteration det / seg |',
             '|---|---|---|---|---|---|---|---|']
    for family in FAMILIES:
        for layout in layouts_of(family):
            cells = {task: [r for r in rows if (r['task'], r['family'], r['layout']) ==
                            (task, family, layout)] for task in METRICS}
            if not any(cells.values()):
                continue
            seeds = sorted({r['seed'] for task_rows in cells.values() for r in task_rows})

            def metric(task: str, name: str) -> str:
                values = [r[name] for r in cells[task]]
                # COCO's mAP is a fraction, mmseg's mIoU a percentage already
                return mean_std(values, 100 if task == 'det' else 1) if values else '—'

            def per_task(task: str, key) -> str:
                values = {key(r) for r in cells[task]}
                return '—' if not values else '/'.join(str(v) for v in sorted(values))

            speed = ' / '.join(
                f"{statistics.mean(60 * r['train_cpu_min'] / r['iters'] for r in cells[t]):.2f}"
                if cells[t] else '—' for t in ('det', 'seg'))
            lines.append(f"| {family} | {layout} | {','.join(map(str, seeds))} "
                         f"| {metric('det', 'coco/bbox_mAP')} | {metric('det', 'coco/segm_mAP')} "
                         f"| {metric('seg', 'mIoU') if cells['seg'] else '—'} "
                         f"| {per_task('det', lambda r: r['iters'])} / "
                         f"{per_task('seg', lambda r: r['iters'])} | {speed} |")
    return '\n'.join(lines)


def cost_table(rows: list[dict]) -> str:
    """Per family and layout: parameters, peak and activations (GB), step time."""
    lines = ['| family | layout | params | peak GB (activations) | step s, this CPU (runs) |',
             '|---|---|---|---|---|']
    for row in rows:
        lines.append(f"| {row['family']} | {row['layout']} | {row['params'] / 1e6:.1f}M "
                     f"| {row['peak'] / 1e9:.2f} ({row['activations'] / 1e9:.2f}) "
                     f"| {min(row['step_s']):.1f} "
                     f"({', '.join(f'{s:.1f}' for s in row['step_s'])}) |")
    return '\n'.join(lines)


def table(args: argparse.Namespace) -> None:
    print(demo_table(read_rows(args.out / 'vitdet_demo.jsonl')))
    print()
    print(cost_table(read_rows(args.out / 'vitdet_cost.jsonl')))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', type=Path, default=ROOT / 'benchmarks/results',
                        help='folder for work dirs and results')
    commands = parser.add_subparsers(dest='command', required=True)
    sweep = commands.add_parser('train', help='the demo cells')
    sweep.add_argument('--tasks', nargs='+', choices=sorted(METRICS), default=sorted(METRICS))
    sweep.add_argument('--families', nargs='+', choices=FAMILIES, default=list(FAMILIES))
    sweep.add_argument('--layouts', nargs='+', choices=list(LAYOUTS), default=list(LAYOUTS))
    sweep.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2])
    sweep.add_argument('--iters-det', type=int, default=DEFAULT_ITERS['det'])
    sweep.add_argument('--iters-seg', type=int, default=DEFAULT_ITERS['seg'])
    sweep.add_argument('--jobs', type=int, default=2, help='cells at a time')
    single = commands.add_parser('one', help=argparse.SUPPRESS)
    single.add_argument('task', choices=sorted(METRICS))
    single.add_argument('family', choices=FAMILIES)
    single.add_argument('layout', choices=sorted(LAYOUTS))
    single.add_argument('seed', type=int)
    single.add_argument('iters_one', type=int)
    measure = commands.add_parser('cost', help='memory and step time at 1024²')
    measure.add_argument('--families', nargs='+', choices=FAMILIES, default=list(FAMILIES))
    measure.add_argument('--repeats', type=int, default=2, help='timed steps per cell')
    measure.add_argument('--threads', type=int, default=2)
    commands.add_parser('table', help='the results as Markdown')
    args = parser.parse_args()
    if args.command == 'train':
        args.iters = {'det': args.iters_det, 'seg': args.iters_seg}
    {'train': train, 'one': one, 'cost': cost, 'table': table}[args.command](args)


if __name__ == '__main__':
    main()
