"""Blockwise attention (talking heads, GPSA) against the written-out maps, and how close a
backbone's training step comes to this machine's matrix-product peak.

    python -m benchmarks.benchmark_attention memory   # saved activations at 2 x 3 x 800 x 1344
    python -m benchmarks.benchmark_attention speed    # training steps, paths interleaved
    python -m benchmarks.benchmark_attention peak     # achieved FLOP/s / measured matmul FLOP/s

memory: what each backbone of the shipped Mask R-CNN configs saves for backward at a COCO
batch (meta device, SDPA counted as a fused kernel: ``tools/analysis_tools/memory.py``),
with the maps written out, as the library chooses (blockwise while training from
``MIN_BLOCKWISE_TOKENS`` tokens), and with ``with_cp=True``.

speed: training steps (forward, a loss over every output, backward) of CaiT-XXS24 and
ConViT-Ti at 224² batch 8 with the maps written out, as chosen, and blockwise throughout;
then at 800 × 1344 batch 2, written-out against blockwise (the chosen path there), CaiT
truncated to its first ``--dense-blocks`` blocks and ConViT to as many gated blocks and
one plain one (whole models' written-out maps do not fit this shared machine).
Each size's paths in one interleaved run (``benchmark_lib.time_interleaved``); the ratio is
the median of paired samples, written-out time / other time (above 1: faster).

peak: FLOPs of a backbone training step (``benchmark_lib.count_flops``, 2 per multiply-add)
per second, as a fraction of a float32 matrix product's FLOP/s on the same threads, per
family at 224² batch 8 and at 512² batch 2 (ADE20k's crop); with the share of step time
of each kind of operator (torch.profiler), to name where the time goes.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
from typing import Iterator, Optional

import torch

import vitdense  # noqa: F401  (registers the backbones)
from benchmarks import benchmark_lib as bm
from vitdense.analysis.memory import count_backbone
from vitdense.models.layers import blockwise_attention
from vitdense.registry import MODELS

GIB = 1 << 30
COCO = (800, 1344)
#: the backbones of the shipped Mask R-CNN configs (arch, patch size)
DETECTION_BACKBONES = (
    ('CaiT', 's24', 16), ('CaiT', 'xxs24', 16), ('XCiT', 'medium_24', 8),
    ('XCiT', 'small_24', 8), ('ConViT', 'base', 16), ('ConViT', 'small', 16),
    ('ViT', 'base', 16), ('XCiT', 'small_12', 16), ('ViT', 'small', 16),
)
PATHS = {'written-out': 10 ** 9, 'chosen': None, 'blockwise': 0}
PEAK_BACKBONES = (('ViT', 'small'), ('CaiT', 'xxs24'), ('XCiT', 'small_12'),
                  ('ConViT', 'tiny'))


@contextlib.contextmanager
def attention_path(name: str) -> Iterator[None]:
    """Within: talking heads and GPSA take the path ``name`` of :data:`PATHS`."""
    threshold = PATHS[name]
    original = blockwise_attention.MIN_BLOCKWISE_TOKENS
    blockwise_attention.MIN_BLOCKWISE_TOKENS = original if threshold is None else threshold
    try:
        yield
    finally:
        blockwise_attention.MIN_BLOCKWISE_TOKENS = original


def backbone(family: str, arch: str, patch_size: int = 16, device: str = 'cpu',
             **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.device(device):
        return MODELS.build(dict(type=f'vitdense.{family}', arch=arch, patch_size=patch_size,
                                 **kwargs)).train()


def memory_table(batch: int = 2, shape: tuple[int, int] = COCO) -> list[dict]:
    rows = []
    for family, arch, patch in DETECTION_BACKBONES:
        images = torch.empty(batch, 3, *shape, device='meta')
        row = dict(backbone=f'{family}-{arch}/{patch}')
        for name in ('written-out', 'chosen'):
            with attention_path(name):
                row[name] = count_backbone(backbone(family, arch, patch, 'meta'), images) / GIB
        row['with_cp'] = count_backbone(backbone(family, arch, patch, 'meta', with_cp=True),
                                        images) / GIB
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _train_step(model: torch.nn.Module, images: torch.Tensor, path: str) -> bm.Step:
    step = bm.make_step(model, images, 'train')

    def run() -> None:
        with attention_path(path):
            step()
    return run


def speed(repeats: int, dense_blocks: int, sizes: tuple[str, ...]) -> list[dict]:
    cases = []
    if '224' in sizes:
        cases += [('CaiT', 'xxs24', {}, 8, (224, 224)), ('ConViT', 'tiny', {}, 8, (224, 224))]
    if 'coco' in sizes:
        # the first blocks only (the same for every block), without the pyramid; ConViT: its
        # gated blocks and one plain block
        cait = dict(arch_overrides=dict(num_layers=dense_blocks), pyramid=False,
                    out_indices=[dense_blocks - 1])
        convit = dict(arch_overrides=dict(num_layers=dense_blocks + 1,
                                          num_local_layers=dense_blocks), pyramid=False,
                      out_indices=[dense_blocks])
        cases += [('CaiT', 'xxs24', cait, 2, COCO), ('ConViT', 'tiny', convit, 2, COCO)]
    rows = []
    for family, arch, kwargs, batch, shape in cases:
        model = backbone(family, arch, **kwargs)
        images = torch.randn(batch, 3, *shape)
        # at 800 x 1344 (4,200 tokens) the chosen path is the blockwise one
        paths = ('written-out', 'chosen', 'blockwise') if shape != COCO else (
            'written-out', 'blockwise')
        samples = bm.time_interleaved({p: _train_step(model, images, p) for p in paths},
                                      warmup=1, repeats=repeats)
        row = dict(model=f'{family}-{arch}' + (f' (first {dense_blocks} block(s))' if kwargs
                                               else ''),
                   batch=batch, shape=list(shape),
                   **{f'{p}_s': statistics.median(samples[p]) for p in paths},
                   **{f'{p}_vs_written_out': bm.paired_ratio(samples['written-out'], samples[p])
                      for p in paths[1:]})
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


MATMUL_SIZE = 2048


def matmul_step(size: int = MATMUL_SIZE) -> bm.Step:
    """A float32 (size × size) @ (size × size) product: 2·size³ FLOPs, the machine's peak
    rate for this work (timed beside each step: the machine is shared)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    return lambda: a @ b


def operator_shares(step: bm.Step) -> dict[str, float]:
    """Share of a step's CPU time per operator kind (self time, top-level aten ops)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    totals: dict[str, float] = {}
    for event in prof.key_averages():
        totals[event.key] = totals.get(event.key, 0.) + event.self_cpu_time_total
    whole = sum(totals.values())
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:6]
    return {key: value / whole for key, value in top}


def peak(repeats: int, sizes: tuple[str, ...], families: tuple[str, ...]) -> list[dict]:
    rows = []
    matmul = matmul_step()
    inputs = {'224': (8, (224, 224)), '512': (2, (512, 512))}
    for batch, shape in (inputs[size] for size in sizes):
        for family, arch in (b for b in PEAK_BACKBONES if b[0] in families):
            model = backbone(family, arch)
            step = bm.make_step(model, torch.randn(batch, 3, *shape), 'train')
            with attention_path('written-out'):  # the model's FLOPs, without recomputation
                flops = bm.count_flops(step)
            samples = bm.time_interleaved({'step': step, 'matmul': matmul}, warmup=1,
                                          repeats=repeats)
            seconds = statistics.median(samples['step'])
            peak_flops = 2 * MATMUL_SIZE ** 3 / statistics.median(samples['matmul'])
            row = dict(model=f'{family}-{arch}', batch=batch, shape=list(shape),
                       gflop=flops / 1e9, step_s=seconds,
                       achieved_gflops=flops / seconds / 1e9,
                       matmul_gflops=peak_flops / 1e9,
                       share_of_peak=bm.paired_ratio(
                           [2 * MATMUL_SIZE ** 3 / t for t in samples['matmul']],
                           [flops / t for t in samples['step']]) ** -1,
                       time_shares=operator_shares(step))
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('what', choices=('memory', 'speed', 'peak'))
    parser.add_argument('--repeats', type=int, default=7)
    parser.add_argument('--dense-blocks', type=int, default=1,
                        help='speed: talking-heads / gated blocks at 800 x 1344')
    parser.add_argument('--sizes', nargs='+', choices=('224', '512', 'coco'),
                        help='speed: 224 (batch 8) and / or coco (800 x 1344, batch 2); '
                             'peak: 224 and / or 512 (batch 2)')
    parser.add_argument('--families', nargs='+', default=[b[0] for b in PEAK_BACKBONES],
                        choices=[b[0] for b in PEAK_BACKBONES], help='peak: these only')
    parser.add_argument('--threads', type=int, default=bm.default_threads())
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.what == 'memory':
        memory_table()
    elif args.what == 'speed':
        speed(args.repeats, args.dense_blocks, tuple(args.sizes or ('224', 'coco')))
    else:
        peak(args.repeats, tuple(args.sizes or ('224', '512')), tuple(args.families))


if __name__ == '__main__':
    main()
