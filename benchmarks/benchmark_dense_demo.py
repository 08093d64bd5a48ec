"""Dense prediction on the demo sets: every family against ResNet-18, same heads, data and minutes.

Each run trains a demo config from scratch for a time budget (``TimeBudgetHook``: the
learning rate decays linearly in the time spent, so fast and slow backbones both finish
their schedule) and then evaluates on the validation split with the real evaluators
(COCO bbox / segm mAP, mIoU). The ResNet-18 row is the vitdense demo config of the task with
only the backbone swapped for mmdet's / mmseg's ResNet-18.

On a machine shared with other jobs wall-clock minutes measure the neighbours, so by default
the budget is CPU time of the run's process with one torch thread and data loading in the
process (``--clock process --threads 1``): what an otherwise idle machine does in that many
minutes on one of its cores. ``--clock wall --threads 2`` measures elapsed time instead.

    nice python -m benchmarks.benchmark_dense_demo                       # everything, ~2.5 h
    nice python -m benchmarks.benchmark_dense_demo --tasks det --families xcit resnet18
    # an ablation: the same run with a recipe change, on another generated set
    nice python -m benchmarks.benchmark_dense_demo --tasks det --families xcit --minutes 7 \
        --cfg-options model.backbone.out_indices=[2,3,4,5] --data-root /tmp/coco_random
    # ViTDet's layout: the simple pyramid, window attention in ViT / CaiT / ConViT
    nice python -m benchmarks.benchmark_dense_demo --tasks seg --layout vitdet
    # EoMT: the demo EoMT of each family (masks annealed over the same fractions of the budget)
    nice python -m benchmarks.benchmark_dense_demo --tasks eomt --families vit cait xcit convit
    # Mask2Former in ViT-Adapter's layout (ViT only), on the set and metric of the EoMT rows
    nice python -m benchmarks.benchmark_dense_demo --tasks mask2former --families vit
    # panoptic (ViT only): Mask2Former and EoMT on the demo COCO panoptic set, PQ
    nice python -m benchmarks.benchmark_dense_demo --tasks panoptic eomt-panoptic --families vit

A (task, family) pair without a demo config (ResNet-18 in EoMT, Mask2Former and panoptic
beyond ViT) is skipped with a line that says so.

Runs go one at a time, each in its own process; results are appended to
``benchmarks/results/dense_demo.jsonl`` and summarised in ``dense_demo.md``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from mmengine.config import DictAction

from vitdense.models import backbone_families

ROOT = Path(__file__).resolve().parents[1]
#: each registered family's demo models (``configs/<family>/``): Mask R-CNN, UperNet and
#: EoMT (semantic, on the ADE20k-layout set)
CONFIGS = {
    task: {family: f'configs/{family}/{prefix}_{family}-d6-p8_{neck}demo-{data}.py'
           for family in backbone_families()}
    for task, prefix, neck, data in (('det', 'mask-rcnn', 'fpn_', 'coco'),
                                     ('seg', 'upernet', '', 'ade'),
                                     ('eomt', 'eomt', '', 'ade'))}
#: Mask2Former (mmseg's head) in ViT-Adapter's layout on the ADE20k-layout set, and panoptic
#: Mask2Former and EoMT on the demo COCO panoptic set: ViT only
CONFIGS.update({
    'mask2former': {'vit': 'configs/vit/mask2former_vit-adapter-d6-p8_demo-ade.py'},
    'panoptic': {'vit': 'configs/vit/mask2former_vit-d6-p8_panoptic_demo-coco.py'},
    'eomt-panoptic': {'vit': 'configs/vit/eomt_vit-d6-p8_panoptic_demo-coco.py'},
})
#: the same demo models in ViTDet's layout: the last block through the simple feature
#: pyramid, window attention and relative positions for the token-attention families
VITDET_CONFIGS = {
    task: {family: f'configs/{family}/{prefix}_{family}-d6-p8_vitdet_demo-{data}.py'
           for family in CONFIGS[task]}
    for task, prefix, data in (('det', 'mask-rcnn', 'coco'), ('seg', 'upernet', 'ade'))}
LAYOUTS = {'multilayer': CONFIGS, 'vitdet': VITDET_CONFIGS}
RESNET18 = {
    'det': dict(type='mmdet.ResNet', depth=18, norm_cfg=dict(type='BN'), norm_eval=False,
                frozen_stages=-1, init_cfg=None),
    'seg': dict(type='mmseg.ResNetV1c', depth=18, norm_cfg=dict(type='BN'), init_cfg=None),
}
RESNET18_CHANNELS = [64, 128, 256, 512]
METRICS = {'det': ('coco/bbox_mAP', 'coco/segm_mAP'), 'seg': ('mIoU',), 'eomt': ('mIoU',),
           'mask2former': ('mIoU',), 'panoptic': ('coco_panoptic/PQ',),
           'eomt-panoptic': ('coco_panoptic/PQ',)}
FAMILIES = (*backbone_families(), 'resnet18')


def has_config(task: str, family: str, layout: str = 'multilayer') -> bool:
    """Whether ``family`` (or ResNet-18, through the det / seg configs) has a demo config of
    ``task`` in ``layout``."""
    if family == 'resnet18':
        return layout == 'multilayer' and task in RESNET18
    return family in LAYOUTS[layout].get(task, {})


def demo_config(task: str, family: str, work_dir: Path, cfg_options: dict | None = None,
                data_root: str | None = None, layout: str = 'multilayer'):
    """The demo config of ``family`` in ``layout`` (or ResNet-18 in the XCiT config), with
    ``cfg_options`` merged in, the data read from ``data_root`` if given, loading in the process
    and a log line every 25 iterations; the schedule is the recipe's."""
    from mmengine.config import Config

    from vitdense.engine.tool_config import point_at_data_root
    if not has_config(task, family, layout):
        raise ValueError(f'no {layout} demo config of {task} for {family}: ResNet-18 runs in '
                         f'the multi-layer layout of det and seg only, EoMT and Mask2Former have '
                         f'no ViTDet layout, Mask2Former and panoptic run on ViT only')
    cfg = Config.fromfile(
        str(ROOT / LAYOUTS[layout][task]['xcit' if family == 'resnet18' else family]))
    if family == 'resnet18':
        channels = RESNET18_CHANNELS
        cfg.model.backbone = RESNET18[task]
        if task == 'det':
            cfg.model.neck.in_channels = channels
        else:
            cfg.model.decode_head.in_channels = channels
            cfg.model.auxiliary_head.in_channels = channels[2]
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if data_root:
        point_at_data_root(cfg, data_root)
    cfg.work_dir = str(work_dir)
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].update(num_workers=0, persistent_workers=False)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=25, log_metric_by_epoch=False)
    return cfg


def build_config(task: str, family: str, train_minutes: float, clock: str, work_dir: Path,
                 cfg_options: dict | None = None, data_root: str | None = None,
                 layout: str = 'multilayer'):
    """:func:`demo_config` on a time budget of ``train_minutes`` by ``clock``; EoMT's mask
    annealing keeps its place in the schedule, as fractions of the budget."""
    from vitdense.engine import train_on_time_budget
    cfg = demo_config(task, family, work_dir, cfg_options, data_root, layout)
    recipe_iters = cfg.train_cfg.max_iters
    for hook in cfg.get('custom_hooks') or []:
        if hook['type'] == 'vitdense.EoMTMaskAnnealingHook':
            hook['start_fractions'] = [i / recipe_iters for i in hook.pop('start_iters')]
            hook['end_fractions'] = [i / recipe_iters for i in hook.pop('end_iters')]
    train_on_time_budget(cfg, train_minutes, clock)
    return cfg


def train_and_test(cfg, task: str, threads: int) -> dict:
    """Train ``cfg`` in this process with ``threads`` torch threads, then test it: iterations,
    backbone parameters, wall and CPU minutes (training, in all) and the task's metrics."""
    import torch
    from mmengine.runner import Runner

    import vitdense  # noqa: F401
    from vitdense.model_factory import register_host
    torch.set_num_threads(threads)
    register_host(cfg)
    start = (time.monotonic(), time.process_time())
    runner = Runner.from_cfg(cfg)
    runner.train()
    trained = (time.monotonic(), time.process_time())
    metrics = runner.test()
    done = (time.monotonic(), time.process_time())
    return dict(iters=runner.iter,
                backbone_params=sum(p.numel() for p in runner.model.backbone.parameters()),
                train_min=(trained[0] - start[0]) / 60, total_min=(done[0] - start[0]) / 60,
                train_cpu_min=(trained[1] - start[1]) / 60,
                total_cpu_min=(done[1] - start[1]) / 60,
                **{name: float(metrics[name]) for name in METRICS[task]})


def run_one(task: str, family: str, train_minutes: float, clock: str, work_dir: Path,
            threads: int, cfg_options: dict | None = None, data_root: str | None = None,
            layout: str = 'multilayer') -> dict:
    """Train and evaluate one (task, family) in this process; return the measured row."""
    cfg = build_config(task, family, train_minutes, clock, work_dir, cfg_options, data_root,
                       layout)
    return dict(task=task, family=family, layout=layout, clock=clock, threads=threads,
                cfg_options=cfg_options or {}, data_root=data_root,
                **train_and_test(cfg, task, threads))


def table(rows: list[dict]) -> str:
    """Markdown: task, family, minutes, iterations, metrics."""
    lines = ['| task | family | backbone params | iterations | minutes (CPU) train / total '
             '| minutes (wall) total | metrics |', '|---|---|---|---|---|---|---|']
    for row in rows:
        values = ', '.join(f'{name.split("/")[-1]} {row[name]:.3f}'
                           for name in METRICS[row['task']])
        lines.append(f"| {row['task']} | {row['family']} | {row['backbone_params'] / 1e6:.2f}M "
                     f"| {row['iters']} | {row['train_cpu_min']:.1f} / "
                     f"{row['total_cpu_min']:.1f} | {row['total_min']:.1f} | {values} |")
    return '\n'.join(lines)


def ensure_data() -> None:
    """Write the demo sets with their default seed if they are missing."""
    from vitdense.demo_data import make_demo_ade, make_demo_coco, make_demo_panoptic
    if not (ROOT / 'data/demo_coco/annotations/instances_val.json').exists():
        make_demo_coco(ROOT / 'data/demo_coco')
    if not (ROOT / 'data/demo_ade/annotations/validation').exists():
        make_demo_ade(ROOT / 'data/demo_ade')
    if not (ROOT / 'data/demo_coco_panoptic/annotations/panoptic_val.json').exists():
        make_demo_panoptic(ROOT / 'data/demo_coco_panoptic')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--tasks', nargs='+', choices=sorted(CONFIGS), default=['det', 'seg'])
    parser.add_argument('--families', nargs='+', choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument('--minutes', type=float, default=15.0,
                        help='budget per run, training plus evaluation')
    parser.add_argument('--eval-minutes', type=float, default=1.0,
                        help='part of the budget kept for evaluation')
    parser.add_argument('--clock', choices=['process', 'wall'], default='process',
                        help='count the budget in CPU time of the run or in elapsed time')
    parser.add_argument('--threads', type=int, default=1, help='torch threads per run')
    parser.add_argument('--out', default='benchmarks/results',
                        help='folder for work dirs and the results table')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={},
                        help='recipe changes (key=value) applied to every run, for ablations')
    parser.add_argument('--data-root', help='read the demo set from here (default data/demo_*)')
    parser.add_argument('--layout', choices=sorted(LAYOUTS), default='multilayer',
                        help="the XCiT paper's multi-layer pyramid or ViTDet's layout")
    parser.add_argument('--one', nargs=2, metavar=('TASK', 'FAMILY'), help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = ROOT / args.out
    train_minutes = args.minutes - args.eval_minutes
    if args.one:
        task, family = args.one
        row = run_one(task, family, train_minutes, args.clock,
                      out / 'dense_demo' / f'{task}_{family}', args.threads,
                      args.cfg_options, args.data_root, args.layout)
        with open(out / 'dense_demo.jsonl', 'a') as f:
            f.write(json.dumps(row) + '\n')
        return
    out.mkdir(parents=True, exist_ok=True)
    ensure_data()
    rows = []
    for task in args.tasks:
        for family in args.families:
            if not has_config(task, family, args.layout):
                print(f'skipped: no {args.layout} demo config of {task} for {family}',
                      flush=True)
                continue
            before = (out / 'dense_demo.jsonl').read_text().splitlines() \
                if (out / 'dense_demo.jsonl').exists() else []
            subprocess.run([sys.executable, __file__, '--one', task, family,
                            '--minutes', str(args.minutes),
                            '--eval-minutes', str(args.eval_minutes), '--out', args.out,
                            '--clock', args.clock, '--threads', str(args.threads),
                            '--layout', args.layout,
                            *(['--data-root', args.data_root] if args.data_root else []),
                            *(['--cfg-options', *(f'{key}={json.dumps(value)}' for key, value
                                                  in args.cfg_options.items())]
                              if args.cfg_options else [])],
                           check=True, cwd=ROOT)
            rows.append(json.loads((out / 'dense_demo.jsonl').read_text().splitlines()[
                len(before)]))
            print(table(rows[-1:]), flush=True)
    summary = table(rows)
    (out / 'dense_demo.md').write_text(summary + '\n')
    print(summary)


if __name__ == '__main__':
    main()
