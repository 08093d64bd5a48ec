"""What a transformer backbone costs in dense prediction: time per training iteration and
peak memory of Mask R-CNN (mmdet) and UperNet (mmseg) with each vitdense family, against
the same detector / segmentor with its released ResNet-50 backbone.

Models are built from the configs that ship with mmdet and mmseg
(``mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py``, ``upernet/upernet_r50_4xb4-80k_ade20k-512x512.py``)
through their registries; only the backbone is swapped (neck / head input channels set to the
backbone width, the multi-layer pyramid giving strides 4-32). An iteration is mmengine's
``train_step`` on a synthetic batch (random images, boxes, masks or label maps, identical for
every model): preprocessing, forward, losses, backward and an AdamW step.

    python -m benchmarks.benchmark_dense --tasks det seg --img-size 512 --batch 2
    python -m benchmarks.benchmark_dense --tasks seg --backbones resnet50 xcit:small_12

Times: median of interleaved iterations after warm-up, all models of a task in one loop.
Memory: each model alone in a fresh subprocess (``MemoryMeter`` in ``benchmark_lib.py``).
SyncBN layers stay: in one process without a process group torch normalises them as BN.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path
from typing import Optional

import torch

from benchmarks import benchmark_lib as bm
from benchmarks.benchmark_lib import ROOT

TASKS = {
    'det': ('mmdet', 'mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'),
    'seg': ('mmseg', 'upernet/upernet_r50_4xb4-80k_ade20k-512x512.py'),
}
RESNET = 'resnet50'
PROBE = bm.module_command('benchmarks.benchmark_dense', '--probe')
DEFAULT_BACKBONES = (RESNET, 'vit:small', 'cait:xxs24', 'xcit:small_12', 'convit:small')
NUM_OBJECTS = 4


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--tasks', nargs='+', choices=sorted(TASKS), default=sorted(TASKS))
    parser.add_argument('--backbones', nargs='+', default=list(DEFAULT_BACKBONES),
                        help=f"'{RESNET}' (the config's own) or <family>:<arch>")
    parser.add_argument('--img-size', type=int, default=512, help='square input size')
    parser.add_argument('--batch', type=int, default=2, help='images per iteration')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--threads', type=int, default=bm.default_threads())
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--no-memory', action='store_true',
                        help='skip the subprocesses (FLOPs are then counted here)')
    parser.add_argument('--out', type=Path, default=ROOT / 'benchmarks/results/dense',
                        help='output path without suffix: <out>.json')
    parser.add_argument('--probe', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        parser.error('--device cuda: no CUDA device is available')
    if 'seg' in args.tasks and args.batch < 2:
        parser.error("--batch must be >= 2 for 'seg': UperNet's BN after global pooling "
                     'needs more than one value per channel')
    for name in args.backbones:
        parse_backbone(name)
    return args


def parse_backbone(name: str) -> Optional[tuple[str, str]]:
    """(family, arch) of '<family>:<arch>', None for the ResNet-50 of the config."""
    if name == RESNET:
        return None
    from vitdense.models import backbone_families

    families = backbone_families()
    family, _, arch = name.partition(':')
    if family not in families or arch not in families[family].arch_zoo:
        raise SystemExit(f'unknown backbone {name!r}: use {RESNET!r} or <family>:<arch> with '
                         f'family in {sorted(families)} and an arch of its table')
    return family, arch


def model_config(task: str, backbone: str, img_size: int):
    """The packaged R50 config's model (a ``ConfigDict``), with the backbone swapped in."""
    from mmengine.config import Config, ConfigDict

    package, path = TASKS[task]
    config = Path(importlib.util.find_spec(package).origin).parent / '.mim/configs' / path
    model = Config.fromfile(str(config)).model.to_dict()
    model['backbone']['init_cfg'] = None  # no pretrained download; weights do not matter
    model.pop('pretrained', None)
    if task == 'seg':
        model['data_preprocessor']['size'] = (img_size, img_size)
    spec = parse_backbone(backbone)
    if spec is None:
        return ConfigDict(model)
    from vitdense.models import backbone_families

    family, arch = spec
    cls = backbone_families()[family]
    width = cls.resolve_arch(arch)['embed_dims']
    model['backbone'] = dict(type=f'vitdense.{cls.__name__}', arch=arch, patch_size=16,
                             pyramid_norm_cfg=dict(type='BN'))
    if task == 'det':
        model['neck']['in_channels'] = [width] * 4
    else:
        model['decode_head']['in_channels'] = [width] * 4
        model['auxiliary_head']['in_channels'] = width
    return ConfigDict(model)


def synthetic_batch(task: str, batch: int, img_size: int, num_classes: int) -> dict:
    """Random uint8 images with random boxes + box masks (det) or label maps (seg); the
    same for every model (fixed seed)."""
    from mmengine.structures import InstanceData, PixelData

    generator = torch.Generator().manual_seed(0)
    size = (img_size, img_size)
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(torch.randint(0, 256, (3, *size), dtype=torch.uint8, generator=generator))
        meta = dict(img_shape=size, ori_shape=size, scale_factor=(1., 1.))
        if task == 'det':
            from mmdet.structures import DetDataSample
            from mmdet.structures.mask import BitmapMasks

            corner = torch.randint(0, img_size // 2, (NUM_OBJECTS, 2), generator=generator)
            extent = torch.randint(img_size // 8, img_size // 2, (NUM_OBJECTS, 2),
                                   generator=generator)
            boxes = torch.cat([corner, (corner + extent).clamp(max=img_size)], dim=1)
            masks = torch.zeros(NUM_OBJECTS, *size, dtype=torch.uint8)
            for mask, (x1, y1, x2, y2) in zip(masks, boxes.tolist()):
                mask[y1:y2, x1:x2] = 1
            sample = DetDataSample(metainfo=meta)
            sample.gt_instances = InstanceData(
                bboxes=boxes.float(), masks=BitmapMasks(masks.numpy(), *size),
                labels=torch.randint(0, num_classes, (NUM_OBJECTS,), generator=generator))
        else:
            from mmseg.structures import SegDataSample

            sample = SegDataSample(metainfo=meta)
            sample.gt_sem_seg = PixelData(
                data=torch.randint(0, num_classes, (1, *size), generator=generator))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def num_classes(model: torch.nn.Module, task: str) -> int:
    return model.roi_head.bbox_head.num_classes if task == 'det' else \
        model.decode_head.num_classes


def make_iteration(task: str, backbone: str, img_size: int, batch: int,
                   device: str) -> tuple[torch.nn.Module, bm.Step]:
    """The model and one training iteration (mmengine ``train_step`` with AdamW)."""
    from mmengine.config import Config
    from mmengine.optim import OptimWrapper

    from vitdense.model_factory import build_model

    torch.manual_seed(0)
    cfg = Config(dict(default_scope=TASKS[task][0],
                      model=model_config(task, backbone, img_size)))
    model = build_model(cfg, 'train').to(device).train()
    data = synthetic_batch(task, batch, img_size, num_classes(model, task))
    wrapper = OptimWrapper(torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.05))

    def iteration() -> None:
        model.train_step(data, wrapper)

    return model, iteration


def probe(spec_json: str) -> None:
    """Child process: one model alone; its FLOPs (counted on the warm-up iteration) and its
    peak memory over the next training iteration."""
    spec = json.loads(spec_json)
    torch.set_num_threads(spec['threads'])
    meter = bm.MemoryMeter(spec['device'])
    _, iteration = make_iteration(spec['task'], spec['backbone'], spec['img_size'],
                                  spec['batch'], spec['device'])
    result = dict(gflops_per_iter=bm.count_flops(iteration) / 1e9)
    result.update(meter.measure(iteration, warmup=0, repeats=1))
    bm.report_probe(result)


def run_task(task: str, args: argparse.Namespace, progress, bar) -> list[dict]:
    """All backbones of one task: built together, timed in one interleaved loop."""
    steps, rows = {}, {}
    for backbone in args.backbones:
        progress.update(bar, description=f'{task}: building {backbone}')
        model, steps[backbone] = make_iteration(task, backbone, args.img_size, args.batch,
                                                args.device)
        rows[backbone] = dict(task=task, backbone=backbone, img_size=args.img_size,
                              batch=args.batch,
                              params_m=sum(p.numel() for p in model.parameters()) / 1e6,
                              backbone_params_m=sum(
                                  p.numel() for p in model.backbone.parameters()) / 1e6)
        if args.no_memory:  # otherwise the memory probe counts them
            rows[backbone]['gflops_per_iter'] = bm.count_flops(steps[backbone]) / 1e9
    progress.update(bar, description=f'{task}: timing {len(steps)} models')
    times = bm.time_interleaved(steps, args.warmup, args.repeats, 0.,
                                bm.synchronizer(args.device))
    del steps
    for backbone, samples in times.items():
        summary = bm.summarize_times(samples, args.batch)
        rows[backbone].update(iter_s=summary['step_s'], spread=summary['spread'],
                              samples_s=summary['samples_s'])
        if not args.no_memory:
            progress.update(bar, description=f'{task}: memory of {backbone}')
            spec = dict(task=task, backbone=backbone, img_size=args.img_size,
                        batch=args.batch, device=args.device, threads=args.threads)
            rows[backbone].update(bm.probe_memory(PROBE, spec))
        progress.advance(bar)
    reference = rows.get(RESNET, {})
    for row in rows.values():
        row['time_vs_r50'] = bm.ratio(row['iter_s'], reference.get('iter_s'))
        row['memory_vs_r50'] = bm.ratio(row.get('memory_mb'), reference.get('memory_mb'))
    return list(rows.values())


def results_table(rows: list[dict]):
    from rich.table import Table

    table = Table(title='training iteration: detector / segmentor by backbone')
    for column in ('task', 'backbone', 'size', 'batch', 'params M', 'GFLOPs/iter', 's/iter',
                   'time × R50', 'MiB', 'memory × R50'):
        table.add_column(column, justify='left' if column in ('task', 'backbone') else 'right')
    fmt = _fmt
    for row in rows:
        table.add_row(row['task'], row['backbone'], str(row['img_size']), str(row['batch']),
                      fmt(row['params_m']), fmt(row.get('gflops_per_iter'), 0),
                      fmt(row['iter_s'], 2), fmt(row['time_vs_r50'], 2),
                      fmt(row.get('memory_mb'), 0), fmt(row['memory_vs_r50'], 2))
    return table


def _fmt(value: Optional[float], digits: int = 1) -> str:
    return '-' if value is None else f'{value:.{digits}f}'


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    if args.probe:
        probe(args.probe)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    torch.set_num_threads(args.threads)
    console = Console(width=max(Console().width, 140))
    meta = bm.environment(args.device, args.threads)
    rows: list[dict] = []
    with Progress('[progress.description]{task.description}', BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console) as progress:
        bar = progress.add_task('dense', total=len(args.tasks) * len(args.backbones))
        for task in args.tasks:
            rows += run_task(task, args, progress, bar)
    meta['load_average_end'] = list(os.getloadavg())
    console.print(results_table(rows))
    bm.write_json(args.out.with_suffix('.json'), meta, rows)
    console.print(f"wrote {args.out.with_suffix('.json')}")


if __name__ == '__main__':
    main()
