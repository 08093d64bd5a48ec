"""Classification benchmarks on this machine (CPU), printed as markdown tables.

``demo``: each family's demo config trains on the demo ImageNet (10 classes, chance 10%) for
a budget of this process's CPU time (one thread, data loading in the process, so the result
does not depend on what else the machine runs) and is evaluated every few hundred
iterations; the table gives minutes, top-1/top-5 and the minutes to reach the 60% floor.

``attn``: ViT-S fine-tuning steps at 384x384 with the full and the attention-only configs
("Three things" §4): trainable parameters, the peak resident memory of a process that runs
the steps, and the bytes autograd keeps for the backward pass. Each mode runs in a fresh
process so the peaks do not mix.

    nice python -m benchmarks.benchmark_cls_demo demo [--families xcit cait] [--minutes 9.5]
    nice python -m benchmarks.benchmark_cls_demo attn [--batch-size 16]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import Runner

import vitdense  # noqa: F401  (vitdense registries)
from vitdense.analysis.saved_tensors import SavedTensors
from vitdense.engine import train_on_time_budget
from vitdense.model_factory import build_model

ROOT = Path(__file__).resolve().parents[1]
DEMO_CONFIGS = {
    'vit': 'configs/vit/vit-mini-p16_1xb64-a2-8e_demo-in10-64px.py',
    'cait': 'configs/cait/cait-mini-p16_1xb64-8e_demo-in10-64px.py',
    'xcit': 'configs/xcit/xcit-mini-p16_1xb64-8e_demo-in10-64px.py',
    'convit': 'configs/convit/convit-mini-p16_1xb64-8e_demo-in10-64px.py',
}
FINETUNE_CONFIGS = {
    'full': 'configs/vit/vit-s-p16_8xb64_in1k-384px.py',
    'attention': 'configs/vit/vit-s-p16-attn_8xb64_in1k-384px.py',
}
FLOOR = 60.0


class AccuracyTimeline(Hook):
    """Record (CPU minutes, wall minutes, top-1, top-5) after every validation.

    CPU minutes are this process's (data loading runs in it: no loader workers), so a run's
    budget does not depend on what else the machine is doing.
    """

    def __init__(self) -> None:
        self.points: list[tuple[float, float, float, float]] = []
        self.start = (0.0, 0.0)

    def before_train(self, runner: Runner) -> None:
        self.start = (time.process_time(), time.perf_counter())

    def after_val_epoch(self, runner: Runner, metrics: dict | None = None) -> None:
        cpu = (time.process_time() - self.start[0]) / 60
        wall = (time.perf_counter() - self.start[1]) / 60
        self.points.append((cpu, wall, metrics['accuracy/top1'], metrics['accuracy/top5']))


def run_demo(family: str, args: argparse.Namespace) -> dict:
    """Train one family's demo config for a CPU-time budget; return its accuracy timeline.

    The budget (``TimeBudgetHook`` on this process's CPU clock, lr annealed over it) covers
    training and the evaluations every ``val_interval`` iterations; one more evaluation
    follows the last iteration.
    """
    cfg = Config.fromfile(ROOT / DEMO_CONFIGS[family])
    for loader in (cfg.train_dataloader, cfg.val_dataloader):
        loader.dataset.data_root = args.data_root
        loader.update(num_workers=0, persistent_workers=False)
    train_on_time_budget(cfg, args.minutes, clock='process')
    cfg.train_cfg.val_interval = args.val_interval
    cfg.test_dataloader = cfg.test_evaluator = cfg.test_cfg = None
    cfg.work_dir = str(Path(args.work_dir) / family)
    cfg.randomness = dict(seed=0)
    runner = Runner.from_cfg(cfg)
    timeline = AccuracyTimeline()
    runner.register_hook(timeline, priority='LOWEST')
    runner.train()
    runner.val_loop.run()
    cpu, wall, top1, top5 = timeline.points[-1]
    reached = next((m for m, _, t1, _ in timeline.points if t1 >= FLOOR), None)
    epochs = runner.iter / len(runner.train_dataloader)
    return dict(family=family, iters=runner.iter, epochs=epochs, cpu_minutes=cpu,
                wall_minutes=wall, top1=top1, top5=top5, cpu_minutes_to_floor=reached,
                timeline=timeline.points)


def demo(args: argparse.Namespace) -> None:
    if not (Path(args.data_root) / 'meta' / 'val.txt').exists():
        from vitdense.demo_data import make_demo_imagenet
        make_demo_imagenet(args.data_root)
    rows = [run_demo(f, args) for f in args.families]
    print(f'\n| family | iterations (epochs) | CPU minutes (1 thread) | wall minutes | top-1 '
          f'| top-5 | CPU minutes to {FLOOR:.0f}% top-1 |')
    print('|---|---|---|---|---|---|---|')
    for r in rows:
        floor = r['cpu_minutes_to_floor']
        floor = '-' if floor is None else f'{floor:.1f}'
        print(f"| {r['family']} | {r['iters']} ({r['epochs']:.1f}) | {r['cpu_minutes']:.1f} | "
              f"{r['wall_minutes']:.1f} | {r['top1']:.1f} | {r['top5']:.1f} | {floor} |")
    print(json.dumps(rows))


def finetune_worker(mode: str, batch_size: int, steps: int) -> dict:
    """Fine-tuning steps of one mode in this process; the peak RSS covers only this mode."""
    from mmengine.optim import build_optim_wrapper
    from mmpretrain.structures import DataSample

    torch.manual_seed(0)
    cfg = Config.fromfile(ROOT / FINETUNE_CONFIGS[mode])
    # random weights (no pretrained ones): memory does not depend on their values
    model = build_model(cfg, 'count')
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    data = dict(inputs=[torch.randint(0, 256, (3, 384, 384), dtype=torch.uint8)
                        for _ in range(batch_size)],
                data_samples=[DataSample().set_gt_label(i) for i in range(batch_size)])
    rss_model = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with SavedTensors().recording() as saved:
        model(**model.data_preprocessor(data, training=True), mode='loss')
    start = time.perf_counter()
    for _ in range(steps):
        model.train_step(data, optim)
    seconds = (time.perf_counter() - start) / steps
    params = list(model.parameters())
    return dict(mode=mode, trainable=sum(p.numel() for p in params if p.requires_grad),
                total=sum(p.numel() for p in params), saved_for_backward=saved.bytes,
                peak_rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                rss_model=rss_model, seconds_per_step=seconds)


def attn(args: argparse.Namespace) -> None:
    rows = []
    for mode in FINETUNE_CONFIGS:
        out = subprocess.run(
            [sys.executable, __file__, 'attn-worker', mode, '--batch-size',
             str(args.batch_size), '--steps', str(args.steps), '--threads', str(args.threads)],
            check=True, capture_output=True, text=True, cwd=ROOT)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    full = rows[0]
    mib = 2 ** 20
    print(f'\nViT-S/16 fine-tuning at 384x384, batch {args.batch_size}, AdamW, CPU')
    print('| mode | trainable params | share | peak RSS (MiB) | vs full | peak above model '
          '(MiB) | vs full | saved for backward (MiB) | s/step |')
    print('|---|---|---|---|---|---|---|---|---|')
    for r in rows:
        above, full_above = r['peak_rss'] - r['rss_model'], full['peak_rss'] - full['rss_model']
        print(f"| {r['mode']} | {r['trainable'] / 1e6:.2f}M | "
              f"{100 * r['trainable'] / r['total']:.1f}% | {r['peak_rss'] / mib:.0f} | "
              f"{100 * (r['peak_rss'] / full['peak_rss'] - 1):+.1f}% | {above / mib:.0f} | "
              f"{100 * (above / full_above - 1):+.1f}% | "
              f"{r['saved_for_backward'] / mib:.0f} | {r['seconds_per_step']:.2f} |")
    print(json.dumps(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest='command', required=True)
    p_demo = sub.add_parser('demo', help='demo-set accuracy per family')
    p_demo.add_argument('--families', nargs='+', default=list(DEMO_CONFIGS),
                        choices=list(DEMO_CONFIGS))
    p_demo.add_argument('--minutes', type=float, default=9.5,
                        help='CPU-time budget per family (training and evaluations)')
    p_demo.add_argument('--val-interval', type=int, default=200,
                        help='iterations between evaluations')
    p_demo.add_argument('--data-root', default=str(ROOT / 'data' / 'demo_in10'))
    p_demo.add_argument('--work-dir', default=str(ROOT / 'work_dirs' / 'benchmark_cls_demo'))
    for name in ('attn', 'attn-worker'):
        p = sub.add_parser(name, help='attention-only vs full fine-tuning memory')
        if name == 'attn-worker':
            p.add_argument('mode', choices=list(FINETUNE_CONFIGS))
        p.add_argument('--batch-size', type=int, default=16)
        p.add_argument('--steps', type=int, default=3)
    for p in sub.choices.values():
        p.add_argument('--threads', type=int, default=1,
                       help='torch threads (1 is fastest for small models on a busy machine)')
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.command == 'demo':
        demo(args)
    elif args.command == 'attn':
        attn(args)
    else:
        print(json.dumps(finetune_worker(args.mode, args.batch_size, args.steps)))


if __name__ == '__main__':
    main()
