"""The ImageNet training pipeline split between loader workers and the device, against all-CPU.

``speed``: on generated JPEGs of ImageNet's sizes (long side 500 px mostly, ~100 KB), in one
run and one thread, interleaved rounds:

* the worker part, as images per core-second (this process's CPU time): the shipped split
  (``vitdense.LoadImageTensor``: read and decode), the split that leaves decoding to the GPU
  (read only) and mmpretrain's all-CPU pipeline (decode, crop, flip, RandAugment, erasing);
* the device part per batch, here on CPU tensors: ``DeviceAugmentPreprocessor`` (crop,
  flip, RandAugment, erasing, normalisation, Mixup / CutMix) against the all-CPU pipeline's
  ``ClsDataPreprocessor`` (normalisation, Mixup / CutMix);
* the loader cores one GPU needs with each pipeline at each family's estimated GPU rate.

``coco``: the COCO training pipelines (the Mask R-CNN 3x recipe's DETR augmentation, ViTDet's
large-scale jitter at 1024) on generated 640² images with 1-4 masked objects, as images per
core-second, and the GPU rate above which each needs more than 4 loader cores per GPU.

``accuracy``: a demo config trained as shipped (its epochs, loader in the process) with the
split pipeline and with the all-CPU pipeline, each for several seeds; top-1 at the end.

    python -m benchmarks.benchmark_data_pipeline speed [--images 120] [--batch 64]
    python -m benchmarks.benchmark_data_pipeline coco [--images 40]
    python -m benchmarks.benchmark_data_pipeline accuracy [--family xcit] [--seeds 0 1 2]
"""
from __future__ import annotations

import argparse
import copy
import io
import json
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from mmengine.config import Config
from mmengine.dataset import Compose, pseudo_collate
from mmengine.registry import init_default_scope
from mmengine.runner import Runner
from PIL import Image

import vitdense  # noqa: F401  (vitdense registries)
import vitdense.cls  # noqa: F401  (LoadImageTensor, DeviceAugmentPreprocessor)
from benchmarks.benchmark_cls_demo import DEMO_CONFIGS
from vitdense.registry import MODELS

ROOT = Path(__file__).resolve().parents[1]
RECIPE = 'configs/cait/cait-xxs24_8xb128_in1k.py'  # the DeiT recipe every family shares
#: (height, width) of generated images and how often each occurs: most ImageNet images have
#: a long side of 500 px at 4:3 or 3:2; a few are larger.
IMAGE_SIZES = {(375, 500): 0.45, (500, 375): 0.15, (333, 500): 0.2, (480, 640): 0.1,
               (600, 800): 0.1}
#: The GPU rate the cores are sized for: ViT-S/16 training images per second on one H100 in a
#: step that keeps it busy (an estimate: 2,100 measured eager, 4,000-7,000 expected compiled
#: and fused), and each family's GFLOPs per 224² image (the papers' tables), by which its
#: rate is scaled: a FLOP-bound estimate, the most images a family's step could ask for.
VIT_S_IMAGES_PER_S = 5000
GFLOPS_224 = {'ViT-Ti/16': 1.3, 'ViT-S/16': 4.6, 'ViT-B/16': 17.6, 'CaiT-XXS24': 2.5,
              'XCiT-S12/16': 4.8, 'ConViT-S': 5.4}


def gpu_rate(family: str) -> float:
    """Estimated training images per second of one H100 for ``family`` (see GFLOPS_224)."""
    return VIT_S_IMAGES_PER_S * GFLOPS_224['ViT-S/16'] / GFLOPS_224[family]


def to_all_cpu(cfg: Config) -> Config:
    """The same recipe with every augmentation in the loader's workers, as mmpretrain runs it."""
    augments = cfg.data_preprocessor.pop('augments')
    cfg.data_preprocessor.type = 'ClsDataPreprocessor'
    cfg.train_dataloader.dataset.pipeline = [dict(type='LoadImageFromFile'), *augments,
                                             dict(type='PackInputs')]
    return cfg


def make_jpegs(folder: Path, count: int, seed: int = 0) -> list[str]:
    """``count`` JPEGs (quality 90) of ImageNet's sizes with photo-like detail and grain."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    sizes, weights = list(IMAGE_SIZES), list(IMAGE_SIZES.values())
    paths = []
    for i in range(count):
        h, w = sizes[rng.choice(len(sizes), p=weights)]
        coarse = Image.fromarray(rng.integers(0, 256, (h // 25 + 2, w // 25 + 2, 3), np.uint8))
        fine = Image.fromarray(rng.integers(0, 256, (h // 5, w // 5, 3), np.uint8))
        picture = (0.7 * np.asarray(coarse.resize((w, h), Image.BICUBIC), np.float32)
                   + 0.3 * np.asarray(fine.resize((w, h), Image.BICUBIC), np.float32)
                   + rng.normal(0, 16, (h, w, 3)))
        buffer = io.BytesIO()
        Image.fromarray(picture.clip(0, 255).astype(np.uint8)).save(buffer, 'JPEG', quality=90)
        paths.append(str(folder / f'{i:05d}.jpg'))
        Path(paths[-1]).write_bytes(buffer.getvalue())
    return paths


def cpu_seconds(fn: Callable[[], object]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def worker_pipelines(cfg: Config) -> dict[str, Compose]:
    """The worker part of each pipeline, as a loader worker runs it."""
    decoded = cfg.train_dataloader.dataset.pipeline
    on_gpu = [dict(type='vitdense.LoadImageTensor', decode=False), dict(type='PackInputs')]
    all_cpu = to_all_cpu(copy.deepcopy(cfg)).train_dataloader.dataset.pipeline
    return {'split (decode in worker)': Compose(decoded),
            'split (decode on GPU)': Compose(on_gpu), 'all-CPU (mmpretrain)': Compose(all_cpu)}


def speed(args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    np.random.seed(0)
    cfg = Config.fromfile(ROOT / RECIPE)
    paths = make_jpegs(Path(args.work_dir) / 'jpegs', args.images)
    pipelines = worker_pipelines(cfg)
    samples: dict[str, list[float]] = {name: [] for name in pipelines}
    for _ in range(args.rounds):  # interleaved, so load changes hit every pipeline alike
        for name, pipeline in pipelines.items():
            seconds = cpu_seconds(lambda: [pipeline(dict(img_path=p)) for p in paths])
            samples[name].append(len(paths) / seconds)
    worker = {name: statistics.median(rates) for name, rates in samples.items()}

    batch = pseudo_collate([pipelines['split (decode in worker)'](dict(img_path=p))
                            for p in paths[:args.batch]])
    cpu_batch = pseudo_collate([pipelines['all-CPU (mmpretrain)'](dict(img_path=p))
                                for p in paths[:args.batch]])
    model_cfg = cfg.data_preprocessor.copy()
    batch_augments = dict(augments=Config.fromfile(ROOT / RECIPE).model.train_cfg.augments)
    device_part = MODELS.build(dict(model_cfg, batch_augments=batch_augments))
    cpu_cfg = to_all_cpu(copy.deepcopy(cfg)).data_preprocessor
    cpu_part = MODELS.build(dict(cpu_cfg, type='mmpretrain.ClsDataPreprocessor',
                                 batch_augments=batch_augments))
    device_seconds, cpu_seconds_ = [], []
    for _ in range(args.rounds):
        device_seconds.append(cpu_seconds(lambda: device_part(batch, training=True)))
        cpu_seconds_.append(cpu_seconds(lambda: cpu_part(cpu_batch, training=True)))
    per_batch = {'split': statistics.median(device_seconds),
                 'all-CPU': statistics.median(cpu_seconds_)}
    result = dict(images=len(paths), mean_kib=float(np.mean([Path(p).stat().st_size
                                                             for p in paths]) / 1024),
                  worker_images_per_core_s=worker, device_s_per_batch=per_batch,
                  batch=args.batch, rounds=args.rounds, threads=torch.get_num_threads())
    report(result)
    return result


def report(result: dict) -> None:
    worker = result['worker_images_per_core_s']
    reference = worker['all-CPU (mmpretrain)']
    print(f"\n{result['images']} JPEGs (mean {result['mean_kib']:.0f} KiB), one thread, "
          f"median of {result['rounds']} interleaved rounds")
    print('| worker part | images per core-second | vs all-CPU |')
    print('|---|---|---|')
    for name, rate in worker.items():
        print(f'| {name} | {rate:.0f} | {rate / reference:.1f}x |')
    per_batch = result['device_s_per_batch']
    print(f"\nDevice part per batch of {result['batch']} on the CPU (1 thread): split "
          f"{per_batch['split'] * 1e3:.0f} ms, all-CPU (normalise, Mixup / CutMix) "
          f"{per_batch['all-CPU'] * 1e3:.0f} ms")
    print('\n| family (estimated GPU images/s) | ' + ' | '.join(worker) + ' |')
    print('|---|' + '---|' * len(worker))
    for family in GFLOPS_224:
        rate = gpu_rate(family)
        cores = ' | '.join(f'{rate / r:.1f}' for r in worker.values())
        print(f'| {family} ({rate:.0f}) | {cores} |')
    print(json.dumps(result))


COCO_PIPELINES = {
    'Mask R-CNN 3x (DETR augmentation)': 'configs/_base_/datasets/coco_instance_detr-aug.py',
    'ViTDet LSJ 1024': 'configs/_base_/datasets/coco_instance_lsj-1024.py'}
CORES_PER_GPU_LIMIT = 4


def coco(args: argparse.Namespace) -> dict:
    """Images per core-second of each COCO training pipeline, run as a loader worker runs it."""
    from mmdet.registry import DATASETS
    from mmengine.registry import init_default_scope as set_scope

    from vitdense.demo_data import make_demo_coco
    set_scope('mmdet')
    np.random.seed(0)
    data_root = make_demo_coco(Path(args.work_dir) / 'coco', num_train=args.images, num_val=1,
                               size=640)
    demo = Config.fromfile(ROOT / 'configs/_base_/datasets/demo_coco.py').train_dataloader
    rates = {}
    for name, path in COCO_PIPELINES.items():
        dataset = DATASETS.build(dict(
            demo.dataset, data_root=str(data_root),
            pipeline=Config.fromfile(ROOT / path).train_dataloader.dataset.pipeline))
        dataset.full_init()  # annotations parsed once, before the clock
        dataset[0]
        seconds = cpu_seconds(lambda: [dataset[i] for i in range(len(dataset))])
        rates[name] = len(dataset) / seconds
    print(f'\n{args.images} generated 640x640 COCO-layout images, one thread')
    print(f'| training pipeline | images per core-second | GPU images/s that need more than '
          f'{CORES_PER_GPU_LIMIT} cores |')
    print('|---|---|---|')
    for name, rate in rates.items():
        print(f'| {name} | {rate:.0f} | {CORES_PER_GPU_LIMIT * rate:.0f} |')
    result = dict(images=args.images, images_per_core_s=rates)
    print(json.dumps(result))
    return result


def train_demo(family: str, pipeline: str, seed: int, args: argparse.Namespace) -> float:
    """Top-1 of one demo training as shipped (its schedule), with the split or all-CPU data."""
    cfg = Config.fromfile(ROOT / DEMO_CONFIGS[family])
    if pipeline == 'all-CPU':
        to_all_cpu(cfg)
    for loader in (cfg.train_dataloader, cfg.val_dataloader):
        loader.dataset.data_root = args.data_root
        loader.update(num_workers=0, persistent_workers=False)
    cfg.train_cfg.val_interval = cfg.train_cfg.max_epochs
    cfg.default_hooks.checkpoint = None
    cfg.test_dataloader = cfg.test_evaluator = cfg.test_cfg = None
    cfg.work_dir = str(Path(args.work_dir) / f'{family}-{pipeline}-{seed}')
    cfg.randomness = dict(seed=seed)
    cfg.default_hooks.logger.interval = 100
    runner = Runner.from_cfg(cfg)
    runner.train()
    return runner.val_loop.run()['accuracy/top1']


def accuracy(args: argparse.Namespace) -> dict:
    if not (Path(args.data_root) / 'meta' / 'val.txt').exists():
        from vitdense.demo_data import make_demo_imagenet
        make_demo_imagenet(args.data_root)
    top1 = {pipeline: [train_demo(args.family, pipeline, seed, args) for seed in args.seeds]
            for pipeline in args.pipelines}
    print(f'\n{args.family} demo config, seeds {args.seeds}')
    print('| pipeline | top-1 per seed | mean | std |')
    print('|---|---|---|---|')
    for pipeline, values in top1.items():
        print(f"| {pipeline} | {', '.join(f'{v:.1f}' for v in values)} | "
              f'{statistics.mean(values):.1f} | '
              f"{statistics.stdev(values) if len(values) > 1 else float('nan'):.1f} |")
    result = dict(family=args.family, seeds=args.seeds, top1=top1)
    print(json.dumps(result))
    return result


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest='command', required=True)
    p_speed = sub.add_parser('speed', help='worker images per core-second, device time')
    p_speed.add_argument('--images', type=int, default=120)
    p_speed.add_argument('--batch', type=int, default=64)
    p_speed.add_argument('--rounds', type=int, default=3)
    p_coco = sub.add_parser('coco', help='COCO pipelines, images per core-second')
    p_coco.add_argument('--images', type=int, default=40)
    p_acc = sub.add_parser('accuracy', help='demo accuracy, split vs all-CPU pipeline')
    p_acc.add_argument('--family', default='xcit', choices=list(DEMO_CONFIGS))
    p_acc.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    p_acc.add_argument('--pipelines', nargs='+', default=['split', 'all-CPU'],
                       choices=['split', 'all-CPU'])
    p_acc.add_argument('--data-root', default=str(ROOT / 'data' / 'demo_in10'))
    for p in (p_speed, p_coco, p_acc):
        p.add_argument('--work-dir', default=str(ROOT / 'work_dirs' / 'benchmark_data_pipeline'))
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    init_default_scope('mmpretrain')
    {'speed': speed, 'coco': coco, 'accuracy': accuracy}[args.command](args)


if __name__ == '__main__':
    main()
