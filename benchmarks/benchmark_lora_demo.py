"""LoRA against full fine-tuning on the demo ADE20k-layout set, from the same pretrained trunk.

1. ``pretrain``: the demo ViT classifier (``configs/vit/vit-mini-p16_1xb64-a2-8e_demo-in10-64px.py``
   with 8×8 patches, the segmentation demo's patch size) trains on the demo ImageNet for
   ``--pretrain-minutes`` and is scored (top-1); its checkpoint is the trunk both
   fine-tunings start from (the position table resampled from 8×8 to 16×16 tokens on load).
2. ``lora`` and ``full``: the LoRA demo UperNet (``configs/vit/upernet_vit-d6-p8_lora_demo-ade.py``:
   rank-8 adapters at 3x the recipe's learning rate, frozen trunk, ``PeftCheckpointHook``) and
   the same config without ``peft`` (every weight trains, all at the recipe's learning rate:
   its ``lora_`` key matches nothing) fine-tune from that checkpoint with fresh heads for
   ``--minutes`` each and are scored with mmseg's IoU metric on the 100 validation images.

Every stage runs in its own process on a budget of that process's CPU time, one torch thread
and data loading in the process (``TimeBudgetHook``: the learning rate anneals linearly over
the budget), so the two fine-tunings, which run side by side, get the same CPU minutes
whatever else the machine runs.
Each row gives the metric, the trainable parameters, the CPU milliseconds of a training step
(median) and the size of the run's last checkpoint (what ``--resume`` needs).

    python -m benchmarks.benchmark_lora_demo       # 2.5 + 2 × 3 CPU-minutes, and start-up
    python -m benchmarks.benchmark_lora_demo --pretrain-minutes 6 --minutes 8
    # an ablation: one fine-tuning from the pretrained checkpoint with a recipe change
    python -m benchmarks.benchmark_lora_demo --stage lora --base CKPT \
        --cfg-options "model.backbone.peft.train=['norms','biases']"
    # the adapters' learning rate multiplier (the shipped demo's is 3)
    python -m benchmarks.benchmark_lora_demo --stage lora --base CKPT \
        --cfg-options optim_wrapper.paramwise_cfg.custom_keys.lora_.lr_mult=1

Rows are appended to ``OUT/lora_demo.jsonl`` and the table written to ``OUT/lora_demo.md``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from mmengine.config import DictAction

ROOT = Path(__file__).resolve().parents[1]
PRETRAIN_CONFIG = 'configs/vit/vit-mini-p16_1xb64-a2-8e_demo-in10-64px.py'
FINETUNE_CONFIG = 'configs/vit/upernet_vit-d6-p8_lora_demo-ade.py'
PATCH_SIZE = 8  # the segmentation demo's: the pretrained patch embedding must match it
STAGES = ('pretrain', 'lora', 'full')
METRICS = {'pretrain': 'accuracy/top1', 'lora': 'mIoU', 'full': 'mIoU'}


def stage_config(stage: str, minutes: float, work_dir: Path, base: Path | None):
    """The config of ``stage`` on a CPU-time budget of ``minutes``, loading in the process;
    the fine-tunings start from the checkpoint ``base``."""
    from mmengine.config import Config

    from vitdense.engine import train_on_time_budget
    if stage == 'pretrain':
        cfg = Config.fromfile(str(ROOT / PRETRAIN_CONFIG))
        cfg.model.backbone.patch_size = PATCH_SIZE
    else:
        cfg = Config.fromfile(str(ROOT / FINETUNE_CONFIG))
        cfg.model.backbone.init_cfg.checkpoint = str(base)
        if stage == 'full':
            cfg.model.backbone.peft = None
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].update(num_workers=0, persistent_workers=False)
    train_on_time_budget(cfg, minutes, clock='process')
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=25, log_metric_by_epoch=False)
    cfg.work_dir = str(work_dir)
    cfg.randomness = dict(seed=0)
    return cfg


def run_stage(stage: str, minutes: float, work_dir: Path, base: Path | None,
              cfg_options: dict | None = None) -> dict:
    """Train and test one stage in this process (one thread); its measured row."""
    import torch
    from mmengine.hooks import Hook
    from mmengine.runner import Runner

    import vitdense  # noqa: F401  (vitdense registries)
    from vitdense.model_factory import register_host

    class StepTimes(Hook):
        """CPU seconds of each training iteration (data loading included)."""

        def __init__(self) -> None:
            self.seconds: list[float] = []

        def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
            self.start = time.process_time()

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
            self.seconds.append(time.process_time() - self.start)

    torch.set_num_threads(1)
    cfg = stage_config(stage, minutes, work_dir, base)
    if stage != 'pretrain' and cfg_options:
        cfg.merge_from_dict(cfg_options)
    register_host(cfg)
    runner = Runner.from_cfg(cfg)
    steps = StepTimes()
    runner.register_hook(steps, priority='VERY_HIGH')
    start = time.process_time()
    runner.train()
    train_minutes = (time.process_time() - start) / 60
    metrics = runner.test()
    checkpoint = max(work_dir.glob('iter_*.pth'), key=lambda path: path.stat().st_mtime)
    params = list(runner.model.parameters())
    return dict(stage=stage, cfg_options=cfg_options or {}, iters=runner.iter,
                train_cpu_min=train_minutes,
                metric_name=METRICS[stage], metric=float(metrics[METRICS[stage]]),
                trainable=sum(p.numel() for p in params if p.requires_grad),
                params=sum(p.numel() for p in params),
                step_ms=1e3 * statistics.median(steps.seconds),
                checkpoint=str(checkpoint),
                checkpoint_bytes=checkpoint.stat().st_size)


def table(rows: list[dict]) -> str:
    """Markdown: one row per stage."""
    lines = ['| stage | metric | trainable / all params | iterations | CPU min | CPU ms / step '
             '| checkpoint MB |', '|---|---|---|---|---|---|---|']
    for row in rows:
        lines.append(
            f"| {row['stage']} | {row['metric_name']} {row['metric']:.1f} | "
            f"{row['trainable'] / 1e6:.2f}M / {row['params'] / 1e6:.2f}M | {row['iters']} | "
            f"{row['train_cpu_min']:.1f} | {row['step_ms']:.0f} | "
            f"{row['checkpoint_bytes'] / 1e6:.1f} |")
    return '\n'.join(lines)


def ensure_data() -> None:
    """Write the demo ImageNet and ADE20k-layout sets with their default seed if missing."""
    from vitdense.demo_data import default_folder, make_demo_ade, make_demo_imagenet
    if not (ROOT / default_folder('imagenet') / 'meta' / 'val.txt').exists():
        make_demo_imagenet(ROOT / default_folder('imagenet'))
    if not (ROOT / default_folder('ade') / 'annotations' / 'validation').exists():
        make_demo_ade(ROOT / default_folder('ade'))


def _last_rows(out: Path) -> dict[str, dict]:
    """The newest row of each stage in ``OUT/lora_demo.jsonl``."""
    rows = [json.loads(line) for line in (out / 'lora_demo.jsonl').read_text().splitlines()]
    return {row['stage']: row for row in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--pretrain-minutes', type=float, default=2.5,
                        help='CPU minutes of classification pretraining')
    parser.add_argument('--minutes', type=float, default=3.0,
                        help='CPU minutes of each fine-tuning (LoRA, full)')
    parser.add_argument('--out', type=Path, default=Path('benchmarks/results'),
                        help='folder for the work dirs and the results')
    parser.add_argument('--stage', choices=STAGES,
                        help='run this stage alone (a fine-tuning from --base)')
    parser.add_argument('--base', type=Path, help='the pretrained checkpoint to fine-tune')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={},
                        help='recipe changes (key=value) for the fine-tunings, for ablations')
    args = parser.parse_args()
    out = ROOT / args.out
    if args.stage:
        minutes = args.pretrain_minutes if args.stage == 'pretrain' else args.minutes
        row = run_stage(args.stage, minutes, out / 'lora_demo' / args.stage, args.base,
                        args.cfg_options)
        with open(out / 'lora_demo.jsonl', 'a') as f:
            f.write(json.dumps(row) + '\n')
        return
    out.mkdir(parents=True, exist_ok=True)
    ensure_data()
    command = [sys.executable, '-m', 'benchmarks.benchmark_lora_demo', '--out', str(args.out),
               '--pretrain-minutes', str(args.pretrain_minutes), '--minutes', str(args.minutes),
               *(['--cfg-options', *(f'{key}={json.dumps(value)}' for key, value
                                     in args.cfg_options.items())] if args.cfg_options else [])]
    subprocess.run([*command, '--stage', 'pretrain'], check=True, cwd=ROOT)
    pretrained = _last_rows(out)['pretrain']
    print(table([pretrained]), flush=True)
    finetunings = [subprocess.Popen([*command, '--stage', stage, '--base',
                                     pretrained['checkpoint']], cwd=ROOT)
                   for stage in ('lora', 'full')]
    if any([process.wait() for process in finetunings]):
        raise SystemExit('a fine-tuning failed (its log is above)')
    rows = [pretrained, _last_rows(out)['lora'], _last_rows(out)['full']]
    lora, full = rows[1], rows[2]
    summary = (f'{table(rows)}\n\nLoRA - full: {lora["metric"] - full["metric"]:+.1f} mIoU; '
               f'LoRA checkpoint {lora["checkpoint_bytes"] / full["checkpoint_bytes"]:.1%} of '
               f'full fine-tuning\'s; step {lora["step_ms"] / full["step_ms"]:.2f}x its time')
    (out / 'lora_demo.md').write_text(summary + '\n')
    print(summary)


if __name__ == '__main__':
    main()
