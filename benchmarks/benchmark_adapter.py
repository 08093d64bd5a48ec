"""The three dense layouts side by side: one training step of the backbone and whatever turns
its output into four levels (the multi-layer pyramid inside the backbone, ViTDet's simple
pyramid neck, ViT-Adapter's modules), on the same input, interleaved.

    python -m benchmarks.benchmark_adapter --size 512 --repeats 3

Heads are left out: they are the same for the three layouts of a recipe.
"""
import argparse
import statistics

import torch
import torch.nn as nn
from mmengine.config import Config

from benchmarks import benchmark_lib
from vitdense.model_factory import build_model

#: ViT-B/16's UperNet recipes in the three layouts
LAYOUTS = {
    'multi-layer pyramid': 'configs/vit/upernet_vit-b-p16_8xb2-160k_ade20k-512x512.py',
    'ViTDet': 'configs/vit/upernet_vit-b-p16_vitdet_8xb2-160k_ade20k-512x512.py',
    'ViT-Adapter': 'configs/vit/upernet_vit-b-p16_adapter_8xb2-160k_ade20k-512x512.py',
}


def dense_features(config: str) -> nn.Module:
    """The config's backbone followed by its neck, where it has one."""
    model = build_model(Config.fromfile(config), 'count')
    neck = getattr(model, 'neck', None)
    return nn.Sequential(model.backbone, neck) if neck is not None else model.backbone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--size', type=int, default=512, help='square input side')
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    inputs = torch.randn(args.batch, 3, args.size, args.size)
    steps = {name: benchmark_lib.make_step(dense_features(config), inputs, 'train')
             for name, config in LAYOUTS.items()}
    samples = benchmark_lib.time_interleaved(steps, warmup=1, repeats=args.repeats,
                                             min_repeat_s=0.)
    reference = samples['ViTDet']
    for name, times in samples.items():
        print(f'{name}: {statistics.median(times):.2f} s per step of {args.batch} × '
              f'{args.size}² (samples {", ".join(f"{t:.2f}" for t in times)}); '
              f'{benchmark_lib.paired_ratio(times, reference):.2f} × ViTDet')


if __name__ == '__main__':
    main()
