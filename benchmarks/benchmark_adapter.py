"""The three dense layouts side by side: one training step of the backbone and whatever turns
its output into four levels (the multi-layer pyramid inside the backbone, ViTDet's simple
pyramid neck, ViT-Adapter's modules), on the same input, interleaved.

    python -m benchmarks.benchmark_adapter --size 512 --repeats 3

Heads are left out: they are the same for the three layouts of a recipe.

With ``--sampler-against REV``: ViT-Adapter-S's injector and extractor (forward + backward,
the same weights and inputs) built from this tree's ``vitdense/models/layers/adapter.py`` and
from the file as at git revision ``REV`` (its imports resolved in this tree), so the two
deformable samplers meet side by side: time interleaved in one process, the largest
difference of their outputs, and the peak memory of each in a fresh process of its own.

    python -m benchmarks.benchmark_adapter --sampler-against REV --size 512 --batch 2 --repeats 5
"""
import argparse
import json
import statistics
import subprocess
import types
from typing import Optional

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
#: ViT-Adapter-S's deformable attention: DeiT-S's width, 6 heads, 4 points, full value width
ADAPTER_S = dict(dims=384, num_heads=6, num_points=4, value_ratio=1.0)


def dense_features(config: str) -> nn.Module:
    """The config's backbone followed by its neck, where it has one."""
    model = build_model(Config.fromfile(config), 'count')
    neck = getattr(model, 'neck', None)
    return nn.Sequential(model.backbone, neck) if neck is not None else model.backbone


def adapter_layers(rev: Optional[str]) -> types.ModuleType:
    """``vitdense/models/layers/adapter.py`` of this tree (``rev`` None) or as at git revision
    ``rev``, its relative imports resolved in this tree."""
    path = 'vitdense/models/layers/adapter.py'
    source = (benchmark_lib.ROOT / path).read_text() if rev is None else subprocess.run(
        ['git', 'show', f'{rev}:{path}'], cwd=benchmark_lib.ROOT, capture_output=True,
        text=True, check=True).stdout
    module = types.ModuleType(f'vitdense.models.layers.adapter_at_{rev or "tree"}')
    module.__package__ = 'vitdense.models.layers'
    exec(compile(source, f'{rev or "tree"}:{path}', 'exec'), module.__dict__)
    return module


def interaction_step(rev: Optional[str], size: int, batch: int
                     ) -> tuple[benchmark_lib.Step, torch.Tensor]:
    """One forward + backward of ViT-Adapter-S's injector and extractor at ``size``² (the
    prior at strides 8, 16 and 32, the trunk at 16), weights and inputs drawn from seed 0;
    and the step's first output."""
    layers = adapter_layers(rev)
    torch.manual_seed(0)
    injector = layers.Injector(**ADAPTER_S, init_values=1.0, with_cp=False)
    extractor = layers.Extractor(**ADAPTER_S, with_cffn=True, cffn_ratio=0.25, drop_path=0.,
                                 with_cp=False)
    prior_shapes = [(-(-size // stride),) * 2 for stride in (8, 16, 32)]
    trunk_shape = (-(-size // 16),) * 2
    geometry = layers.AdapterGeometry.of(prior_shapes, trunk_shape, torch.device('cpu'))
    patches = torch.randn(batch, trunk_shape[0] * trunk_shape[1], ADAPTER_S['dims'])
    prior = torch.randn(batch, sum(h * w for h, w in prior_shapes), ADAPTER_S['dims'])
    outputs = []

    def step() -> None:
        injector.zero_grad(set_to_none=True)
        extractor.zero_grad(set_to_none=True)
        injected = injector(patches, prior, geometry)
        extracted = extractor(prior, injected, geometry)
        (injected.mean() + extracted.mean()).backward()
        outputs[:] = [extracted.detach()]
    step()
    return step, outputs[0]


def sampler_probe(spec: dict) -> None:
    """The child of :func:`compare_samplers`: the peak memory of one revision's step."""
    meter = benchmark_lib.MemoryMeter('cpu')
    step, _ = interaction_step(spec['rev'], spec['size'], spec['batch'])
    benchmark_lib.report_probe(meter.measure(step, warmup=1, repeats=2))


def compare_samplers(rev: str, size: int, batch: int, repeats: int) -> None:
    """This tree's deformable attention against revision ``rev``'s (see the module's doc)."""
    steps, outputs = {}, {}
    for name in ('this tree', rev):
        steps[name], outputs[name] = interaction_step(None if name == 'this tree' else name,
                                                      size, batch)
    difference = (outputs['this tree'] - outputs[rev]).abs().max().item()
    samples = benchmark_lib.time_interleaved(steps, warmup=1, repeats=repeats, min_repeat_s=0.)
    for name, times in samples.items():
        memory = benchmark_lib.probe_memory(
            benchmark_lib.module_command('benchmarks.benchmark_adapter', '--sampler-probe'),
            dict(rev=None if name == 'this tree' else name, size=size, batch=batch,
                 threads=torch.get_num_threads()))
        print(f'{name}: {statistics.median(times):.3f} s per step of {batch} × {size}² '
              f'(samples {", ".join(f"{t:.3f}" for t in times)}), '
              f'{benchmark_lib.paired_ratio(times, samples[rev]):.2f} × {rev}; '
              f'peak memory {json.dumps(memory)}')
    print(f'largest output difference: {difference:.1e}')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--size', type=int, default=512, help='square input side')
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--sampler-against', metavar='REV',
                        help="ViT-Adapter-S's injector and extractor, this tree against REV")
    parser.add_argument('--sampler-probe', metavar='SPEC', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sampler_probe:
        sampler_probe(json.loads(args.sampler_probe))
        return
    if args.sampler_against:
        compare_samplers(args.sampler_against, args.size, args.batch, args.repeats)
        return
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
