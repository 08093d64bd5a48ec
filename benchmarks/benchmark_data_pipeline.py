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

``device``: on ``--device`` (a GPU where there is one), the shipped split's device part
(``DeviceAugmentPreprocessor`` of the DeiT recipe: crop, flip, RandAugment, erasing,
normalisation, Mixup / CutMix) on a batch of decoded ImageNet-sized images as the workers hand
it on, against one ViT-S/16 training step at 224² on that batch (the ViT-S config's model and
optimizer; bf16 autocast on a GPU, float32 on the CPU), interleaved rounds; the device part's
share of the step is what the split costs the GPU (the floor: 5 % on a GPU).

``coco``: the COCO training pipelines (the Mask R-CNN 3x recipe's DETR augmentation, ViTDet's
large-scale jitter at 1024) on generated 640² images with 1-4 masked objects, as images per
core-second, and the GPU rate above which each needs more than 4 loader cores per GPU.

``accuracy``: a demo config trained as shipped (its epochs, loader in the process) with the
split pipeline and with the all-CPU pipeline, each for several seeds; top-1 at the end.

    python -m benchmarks.benchmark_data_pipeline speed [--images 120] [--batch 64]
    python -m benchmarks.benchmark_data_pipeline device [--batch 128] [--rounds 10] [--gpu-decode]
    python -m benchmarks.benchmark_data_pipeline coco [--images 40]
    python -m benchmarks.benchmark_data_pipeline accuracy [--family xcit] [--seeds 0 1 2]
"""
from __future__ import annotations

import argparse
import copy
import io
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Callable, ContextManager, Sequence

import numpy as np
import torch
from mmengine.config import Config
from mmengine.dataset import Compose, pseudo_collate
from mmengine.logging import MMLogger
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope, init_default_scope
from mmengine.runner import Runner
from PIL import Image

import vitdense  # noqa: F401  (vitdense registries)
import vitdense.cls  # noqa: F401  (LoadImageTensor, DeviceAugmentPreprocessor)
from benchmarks.benchmark_cls_demo import DEMO_CONFIGS
from benchmarks.benchmark_lib import environment
from vitdense.model_factory import build_model, register_host
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


def make_jpegs(folder: Path, count: int, seed: int = 0,
               image_sizes: dict[tuple[int, int], float] = IMAGE_SIZES) -> list[str]:
    """``count`` JPEGs (quality 90) with photo-like detail and grain, their (height, width)
    drawn from ``image_sizes`` (ImageNet's by default)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    sizes, weights = list(image_sizes), list(image_sizes.values())
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


def device_preprocessor(cfg: Config) -> torch.nn.Module:
    """The recipe's ``DeviceAugmentPreprocessor`` with its Mixup / CutMix, as its model has it."""
    return MODELS.build(dict(cfg.data_preprocessor,
                             batch_augments=dict(augments=cfg.model.train_cfg.augments)))


def worker_batch(pipeline: Compose, paths: Sequence[str], num_classes: int = 1000) -> dict:
    """The batch a loader hands on: each image through the worker ``pipeline`` with a class
    label (so that Mixup / CutMix run), collated as mmengine's ``pseudo_collate`` does."""
    return pseudo_collate([pipeline(dict(img_path=path, gt_label=i % num_classes))
                           for i, path in enumerate(paths)])


def fresh(batch: dict) -> dict:
    """``batch`` with copies of its data samples: the preprocessor writes the mixed scores
    into them, and the next call must start from the labels again."""
    return dict(batch, data_samples=copy.deepcopy(batch['data_samples']))


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

    batch = worker_batch(pipelines['split (decode in worker)'], paths[:args.batch])
    cpu_batch = worker_batch(pipelines['all-CPU (mmpretrain)'], paths[:args.batch])
    device_part = device_preprocessor(cfg)
    cpu_cfg = to_all_cpu(copy.deepcopy(cfg)).data_preprocessor
    cpu_part = MODELS.build(dict(cpu_cfg, type='mmpretrain.ClsDataPreprocessor',
                                 batch_augments=dict(augments=cfg.model.train_cfg.augments)))
    device_seconds, cpu_seconds_ = [], []
    for _ in range(args.rounds):
        data, cpu_data = fresh(batch), fresh(cpu_batch)
        device_seconds.append(cpu_seconds(lambda: device_part(data, training=True)))
        cpu_seconds_.append(cpu_seconds(lambda: cpu_part(cpu_data, training=True)))
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


VIT_S_CONFIG = 'configs/vit/vit-s-p16_8xb256-a2_in1k.py'  # the ViT-S/16 recipe users train
DEVICE_PART_FLOOR = 0.05  # the most of a ViT-S step the device part may take on a GPU
GPU_DECODE_ON_CPU = ('--gpu-decode skipped: decoding on the device times torchvision\'s '
                     "decode_jpeg(device='cuda') (nvJPEG), and this run is on the CPU")


def vit_s_training(device: torch.device) -> tuple[Callable[[], ContextManager],
                                                  Callable[[dict], None]]:
    """The ViT-S/16 config's model and optimizer on ``device``, as the Runner trains them:
    its precision context (bf16 autocast on a GPU, float32 on the CPU) and its training step
    on a preprocessed batch (forward, loss, backward, optimizer step: mmengine's
    ``BaseModel.train_step`` after the data preprocessor)."""
    cfg = Config.fromfile(ROOT / VIT_S_CONFIG)
    model = build_model(cfg, 'train', device=device).train()
    wrapper_cfg = cfg.optim_wrapper
    if device.type == 'cuda':
        wrapper_cfg = dict(wrapper_cfg, type='AmpOptimWrapper', dtype='bfloat16')
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)  # not a line per parameter group
    try:
        with DefaultScope.overwrite_default_scope(cfg.default_scope):
            wrapper = build_optim_wrapper(model, wrapper_cfg)
    finally:
        logger.setLevel(level)

    def step(data: dict) -> None:
        with wrapper.optim_context(model):
            losses = model(data['inputs'], data['data_samples'], mode='loss')
        parsed, _ = model.parse_losses(losses)
        wrapper.update_params(parsed)
    return lambda: wrapper.optim_context(model), step


def timed(fn: Callable[[], object], device: torch.device) -> tuple[object, float]:
    """``fn()`` and its seconds: on a GPU between CUDA events recorded around it after a
    synchronisation (the host's launches and the device's work), on the CPU wall time."""
    if device.type != 'cuda':
        start = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - start
    torch.cuda.synchronize(device)
    begin, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    begin.record()
    out = fn()
    end.record()
    end.synchronize()
    return out, begin.elapsed_time(end) / 1e3


def device_part_vs_step(device: torch.device, batch: int, rounds: int, folder: Path,
                        image_sizes: dict[tuple[int, int], float] = IMAGE_SIZES,
                        gpu_decode: bool = False) -> dict:
    """Seconds of the recipe's device part on a worker batch of ``batch`` JPEGs of
    ``image_sizes`` (and, with ``gpu_decode`` on a GPU, of the same part decoding the bytes
    itself) against the ViT-S step on its output, in ``rounds`` interleaved rounds after one
    untimed round; medians, and the device part's share of the step."""
    cfg = Config.fromfile(ROOT / RECIPE)
    register_host(cfg)
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        pipelines = worker_pipelines(cfg)
        paths = make_jpegs(folder, batch, image_sizes=image_sizes)
        classes = cfg.data_preprocessor.num_classes
        batches = {'device part': worker_batch(pipelines['split (decode in worker)'], paths,
                                               classes)}
        skipped = None
        if gpu_decode and device.type == 'cuda':
            batches['device part, GPU decode'] = worker_batch(
                pipelines['split (decode on GPU)'], paths, classes)
        elif gpu_decode:
            skipped = GPU_DECODE_ON_CPU
            print(skipped)
        part = device_preprocessor(cfg).to(device)
        precision, step = vit_s_training(device)
        seconds: dict[str, list[float]] = {name: [] for name in [*batches, 'ViT-S step']}
        for _ in range(rounds + 1):  # the first round warms up (allocator, kernels)
            for name, data in batches.items():
                data = fresh(data)
                with precision():
                    out, elapsed = timed(lambda: part(data, training=True), device)
                seconds[name].append(elapsed)
            seconds['ViT-S step'].append(timed(lambda: step(out), device)[1])
    medians = {name: statistics.median(values[1:]) for name, values in seconds.items()}
    step_s = medians.pop('ViT-S step')
    return dict(
        device=str(device), recipe=RECIPE, vit_s_config=VIT_S_CONFIG,
        step_dtype='bfloat16' if device.type == 'cuda' else 'float32',
        batch=batch, rounds=rounds,
        image_sizes={f'{h}x{w}': share for (h, w), share in image_sizes.items()},
        input=list(out['inputs'].shape[1:]), vit_s_step_ms=1e3 * step_s,
        device_part_ms={name: 1e3 * s for name, s in medians.items()},
        device_part_percent={name: 100 * s / step_s for name, s in medians.items()},
        floor_percent=100 * DEVICE_PART_FLOOR, gpu_decode_skipped=skipped,
        samples_ms={name: [1e3 * s for s in values[1:]] for name, values in seconds.items()})


def device_report(result: dict) -> None:
    """The medians and the device part's share of the step, as a table."""
    print(f"\nBatch of {result['batch']} on {result['device']} "
          f"({result.get('gpu', result['cpu'])}), median of {result['rounds']} interleaved "
          f"rounds; ViT-S/16 step {result['vit_s_step_ms']:.1f} ms ({result['step_dtype']})")
    print('| device part | ms | % of the ViT-S step |')
    print('|---|---|---|')
    for name, ms in result['device_part_ms'].items():
        print(f"| {name} | {ms:.1f} | {result['device_part_percent'][name]:.1f} % |")
    if result['device'] == 'cpu':
        print(f"On the CPU: a check that the measurement runs; the {result['floor_percent']:.0f} "
              '% floor is for a GPU.')


def device(args: argparse.Namespace) -> dict:
    sizes = {tuple(args.image_size): 1.0} if args.image_size else IMAGE_SIZES
    result = device_part_vs_step(torch.device(args.device), args.batch, args.rounds,
                                 Path(args.work_dir) / 'device_jpegs', sizes, args.gpu_decode)
    result.update(environment(args.device, torch.get_num_threads()))
    device_report(result)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + '\n')
    return result


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
    p_device = sub.add_parser('device', help='device part against a ViT-S training step')
    p_device.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p_device.add_argument('--batch', type=int, default=128)
    p_device.add_argument('--rounds', type=int, default=10)
    p_device.add_argument('--image-size', type=int, nargs=2, metavar=('HEIGHT', 'WIDTH'),
                          help="every image this size (default: ImageNet's mix of sizes)")
    p_device.add_argument('--gpu-decode', action='store_true',
                          help='also time the device part decoding the JPEG bytes itself '
                               '(nvJPEG; skipped on the CPU)')
    p_device.add_argument('--out', help='write the result as JSON to this file')
    p_coco = sub.add_parser('coco', help='COCO pipelines, images per core-second')
    p_coco.add_argument('--images', type=int, default=40)
    p_acc = sub.add_parser('accuracy', help='demo accuracy, split vs all-CPU pipeline')
    p_acc.add_argument('--family', default='xcit', choices=list(DEMO_CONFIGS))
    p_acc.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    p_acc.add_argument('--pipelines', nargs='+', default=['split', 'all-CPU'],
                       choices=['split', 'all-CPU'])
    p_acc.add_argument('--data-root', default=str(ROOT / 'data' / 'demo_in10'))
    for p in (p_speed, p_device, p_coco, p_acc):
        p.add_argument('--work-dir', default=str(ROOT / 'work_dirs' / 'benchmark_data_pipeline'))
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    init_default_scope('mmpretrain')
    {'speed': speed, 'device': device, 'coco': coco,
     'accuracy': accuracy}[args.command](args)


if __name__ == '__main__':
    main()
