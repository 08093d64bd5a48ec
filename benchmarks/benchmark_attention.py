"""Talking heads and GPSA in fused attention against their written-out maps, and how close
a backbone's training step comes to this machine's matrix-product peak.

    python -m benchmarks.benchmark_attention memory   # saved activations at 2 x 3 x 800 x 1344
    python -m benchmarks.benchmark_attention layers   # one attention layer's training step
    python -m benchmarks.benchmark_attention crossover  # talking heads' paths by grid size
    python -m benchmarks.benchmark_attention block-rows  # the CPU operator's block height
    python -m benchmarks.benchmark_attention peak     # achieved FLOP/s / measured matmul FLOP/s
    python -m benchmarks.benchmark_attention eomt-masks  # EoMT's masks in XCA and token attention

memory: what each backbone of the shipped Mask R-CNN configs saves for backward at a COCO
batch on a GPU (meta device, SDPA counted as a fused kernel:
``tools/analysis_tools/memory.py``), with talking heads' maps written out, as the library
chooses (folded into one fused call from 2,048 tokens), and with ``with_cp=True``.

layers: the training step (forward, a loss over the output, backward) of one attention layer
of CaiT-XXS24's / ConViT-Ti's width (192, 4 heads of 48): plain attention, talking heads as
chosen (the CPU operator on a CPU), folded into one fused call and written out, GPSA and
GPSA with its positional attention written out as an (heads, N, N) map; at 224² batch 8
(14 × 14 tokens) and at 800 × 1344 batch 2 (50 × 84).
The steps of one size are interleaved in one run (``benchmark_lib.time_interleaved``); a
ratio is the median of paired samples, the step's time / plain attention's time.

crossover: the same layer's talking heads on each fused path against the written-out maps
at square grids of 14² to 40² tokens (batch 1,600 // tokens, at least 2): where each path
starts to pay (``talking_heads.FUSED_PATHS``).

block-rows: talking heads' CPU operator in the layer step at 800 × 1344 batch 2, at 4 and 8
heads of 48 (CaiT-XXS24's and CaiT-S24's widths), per row count of its blocks
(``talking_heads_cpu.BLOCK_ROWS``), against plain attention of the same width.

peak: FLOPs of a backbone training step (``benchmark_lib.count_flops``, 2 per multiply-add)
per second, as a fraction of a float32 matrix product's FLOP/s on the same threads, per
family at 224² batch 8 and at 512² batch 2 (ADE20k's crop); with the share of step time
of each kind of operator (torch.profiler), to name where the time goes.

eomt-masks: the training step of one attention layer of XCiT-S12's width (384, 8 heads of 48)
on EoMT's tokens at ADE20k's crop (100 queries and 32 × 32 patches of 16 px, batch 2), each
query masked to a random half of the patches: XCA without and with the masks (each masked
query's covariance over its patches, ``masked_cross_covariance``), and token attention of the
same width without and with them; ratios to the unmasked layer.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
from typing import Optional

import torch
import torch.nn.functional as F

import vitdense  # noqa: F401  (registers the backbones)
from benchmarks import benchmark_lib as bm
from vitdense.analysis.memory import count_backbone
from vitdense.models.layers import (CrossCovarianceAttention, GatedPositionalSelfAttention,
                                    MultiheadSelfAttention, talking_heads, talking_heads_cpu)
from vitdense.registry import MODELS

GIB = 1 << 30
COCO = (800, 1344)
#: the backbones of the shipped Mask R-CNN configs (arch, patch size)
DETECTION_BACKBONES = (
    ('CaiT', 's24', 16), ('CaiT', 'xxs24', 16), ('XCiT', 'medium_24', 8),
    ('XCiT', 'small_24', 8), ('ConViT', 'base', 16), ('ConViT', 'small', 16),
    ('ViT', 'base', 16), ('XCiT', 'small_12', 16), ('ViT', 'small', 16),
)
PEAK_BACKBONES = (('ViT', 'small'), ('CaiT', 'xxs24'), ('XCiT', 'small_12'),
                  ('ConViT', 'tiny'))
#: (batch, token grid) of the layer steps: 224² batch 8 and 800 × 1344 batch 2 at patch 16
LAYER_INPUTS = {'224': (8, (14, 14)), 'coco': (2, (50, 84))}
LAYER_WIDTH, LAYER_HEADS = 192, 4


def attention_path(model: torch.nn.Module, name: str) -> contextlib.AbstractContextManager:
    """Within: the talking heads of ``model`` take the path ``name`` of
    ``talking_heads.PATHS``, or ``'chosen'``: the library's choice."""
    if name == 'chosen':
        return contextlib.nullcontext()
    return talking_heads.forced_path(model, name)


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
        for name in ('maps', 'chosen'):
            model = backbone(family, arch, patch, 'meta')
            with attention_path(model, name):
                row[name] = count_backbone(model, images) / GIB
        row['with_cp'] = count_backbone(backbone(family, arch, patch, 'meta', with_cp=True),
                                        images) / GIB
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def written_out_gpsa(mixer: GatedPositionalSelfAttention, x: torch.Tensor,
                     hw: tuple[int, int]) -> torch.Tensor:
    """GPSA with its positional attention as one (heads, N, N) map applied to every image's
    values (the content term fused, as in the library)."""
    batch, tokens, _ = x.shape
    q, k = mixer.qk(x).view(batch, tokens, 2, mixer.num_heads, -1).permute(2, 0, 3, 1, 4)
    v = mixer.v(x).view(batch, tokens, mixer.num_heads, -1).transpose(1, 2)
    content = F.scaled_dot_product_attention(q, k, v)
    positional = mixer.positional_attention(hw) @ v
    out = torch.lerp(content, positional, torch.sigmoid(mixer.gating).view(-1, 1, 1))
    return mixer.proj(out.transpose(1, 2).flatten(-2))


def layer_steps(batch: int, hw: tuple[int, int]) -> dict[str, bm.Step]:
    """Training steps of one attention layer per path, on the same tokens."""
    torch.manual_seed(0)
    x = torch.randn(batch, hw[0] * hw[1], LAYER_WIDTH, requires_grad=True)
    plain = MultiheadSelfAttention(LAYER_WIDTH, LAYER_HEADS)
    heads = MultiheadSelfAttention(LAYER_WIDTH, LAYER_HEADS, talking_heads=True)
    gpsa = GatedPositionalSelfAttention(LAYER_WIDTH, LAYER_HEADS)
    gpsa.convolutional_init()

    def step(forward, path: str = 'chosen') -> bm.Step:
        def run() -> None:
            with attention_path(heads, path):
                forward(x, hw).square().mean().backward()
        return run

    return {'plain': step(plain), 'talking heads': step(heads),
            'talking heads fold': step(heads, 'fold'),
            'talking heads written out': step(heads, 'maps'),
            'gpsa': step(gpsa),
            'gpsa written out': step(lambda x, hw: written_out_gpsa(gpsa, x, hw))}


def layers(repeats: int, sizes: tuple[str, ...]) -> list[dict]:
    rows = []
    for size in sizes:
        batch, hw = LAYER_INPUTS[size]
        samples = bm.time_interleaved(layer_steps(batch, hw), warmup=1, repeats=repeats)
        row = dict(batch=batch, grid=list(hw),
                   **{f'{name} s': statistics.median(times) for name, times in samples.items()},
                   **{f'{name} / plain': bm.paired_ratio(times, samples['plain'])
                      for name, times in samples.items() if name != 'plain'},
                   **{f'{name} / written out': bm.paired_ratio(samples[name],
                                                               samples[f'{name} written out'])
                      for name in ('talking heads', 'gpsa')})
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


CROSSOVER_SIDES = (14, 20, 24, 28, 32, 40)


def crossover(repeats: int, sides: tuple[int, ...] = CROSSOVER_SIDES) -> list[dict]:
    """One row per square grid: each talking-heads path's step time and its paired ratio
    to the written-out maps'."""
    rows = []
    for side in sides:
        tokens = side * side
        batch = max(2, 1600 // tokens)
        torch.manual_seed(0)
        x = torch.randn(batch, tokens, LAYER_WIDTH, requires_grad=True)
        layer = MultiheadSelfAttention(LAYER_WIDTH, LAYER_HEADS, talking_heads=True)

        def step(path: str) -> bm.Step:
            def run() -> None:
                with attention_path(layer, path):
                    layer(x, (side, side)).square().mean().backward()
            return run

        paths = talking_heads.available_paths(x.device)
        samples = bm.time_interleaved({path: step(path) for path in paths},
                                      warmup=1, repeats=repeats)
        row = dict(batch=batch, grid=[side, side],
                   **{f'{path} s': statistics.median(times) for path, times in samples.items()},
                   **{f'{path} / maps': bm.paired_ratio(samples[path], samples['maps'])
                      for path in paths if path != 'maps'})
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


BLOCK_ROW_COUNTS = (16, 32, 48, 64, 96, 128)


def block_rows(repeats: int, counts: tuple[int, ...] = BLOCK_ROW_COUNTS,
               hw: tuple[int, int] = (50, 84), batch: int = 2) -> list[dict]:
    """One row per width: the operator's step time per block height and its paired ratio
    to plain attention's."""
    rows = []
    for heads in (LAYER_HEADS, 2 * LAYER_HEADS):
        width = heads * LAYER_WIDTH // LAYER_HEADS
        torch.manual_seed(0)
        x = torch.randn(batch, hw[0] * hw[1], width, requires_grad=True)
        plain = MultiheadSelfAttention(width, heads)
        layer = MultiheadSelfAttention(width, heads, talking_heads=True)

        def step(count: int) -> bm.Step:
            def run() -> None:
                default, talking_heads_cpu.BLOCK_ROWS = talking_heads_cpu.BLOCK_ROWS, count
                try:
                    with attention_path(layer, 'blocks'):
                        layer(x, hw).square().mean().backward()
                finally:
                    talking_heads_cpu.BLOCK_ROWS = default
            return run

        steps = {'plain': lambda: plain(x, hw).square().mean().backward(),
                 **{f'{count} rows': step(count) for count in counts}}
        samples = bm.time_interleaved(steps, warmup=1, repeats=repeats)
        row = dict(heads=heads, width=width, batch=batch, grid=list(hw),
                   **{f'{name} s': statistics.median(times) for name, times in samples.items()},
                   **{f'{name} / plain': bm.paired_ratio(times, samples['plain'])
                      for name, times in samples.items() if name != 'plain'})
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
            with attention_path(model, 'maps'):  # the model's FLOPs, without the fold's
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


#: EoMT-S on XCiT-S12 at ADE20k's crop: width, heads, queries, patch grid, batch
EOMT_LAYER = dict(width=384, heads=8, queries=100, grid=(32, 32), batch=2)


def eomt_masks(repeats: int) -> dict:
    """Training steps of one XCA and one token-attention layer on EoMT's tokens, without
    and with the queries' masks (a random half of the patches each)."""
    torch.manual_seed(0)
    width, heads, queries = EOMT_LAYER['width'], EOMT_LAYER['heads'], EOMT_LAYER['queries']
    batch, patches = EOMT_LAYER['batch'], EOMT_LAYER['grid'][0] * EOMT_LAYER['grid'][1]
    x = torch.randn(batch, queries + patches, width, requires_grad=True)
    mask = torch.ones(batch, queries, queries + patches, dtype=torch.bool)
    mask[..., queries:] = torch.rand(batch, queries, patches) > 0.5
    xca, plain = CrossCovarianceAttention(width, heads), MultiheadSelfAttention(width, heads)

    def step(layer: torch.nn.Module, masked: bool) -> bm.Step:
        options = dict(attn_mask=mask) if masked else {}
        return lambda: layer(x, EOMT_LAYER['grid'], **options).square().mean().backward()

    samples = bm.time_interleaved(
        {'xca': step(xca, False), 'xca masked': step(xca, True),
         'attention': step(plain, False), 'attention masked': step(plain, True)},
        warmup=1, repeats=repeats)
    row = dict(EOMT_LAYER, **{f'{name} s': statistics.median(t) for name, t in samples.items()},
               **{'xca masked / xca': bm.paired_ratio(samples['xca masked'], samples['xca']),
                  'attention masked / attention': bm.paired_ratio(samples['attention masked'],
                                                                  samples['attention']),
                  'xca masked / attention masked': bm.paired_ratio(
                      samples['xca masked'], samples['attention masked'])})
    print(json.dumps(row), flush=True)
    return row


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('what', choices=('memory', 'layers', 'crossover', 'block-rows', 'peak',
                                         'eomt-masks'))
    parser.add_argument('--repeats', type=int, default=7)
    parser.add_argument('--sizes', nargs='+', choices=('224', '512', 'coco'),
                        help='layers: 224 (batch 8) and / or coco (800 x 1344, batch 2); '
                             'peak: 224 and / or 512 (batch 2)')
    parser.add_argument('--families', nargs='+', default=[b[0] for b in PEAK_BACKBONES],
                        choices=[b[0] for b in PEAK_BACKBONES], help='peak: these only')
    parser.add_argument('--threads', type=int, default=bm.default_threads())
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.what == 'memory':
        memory_table()
    elif args.what == 'layers':
        layers(args.repeats, tuple(args.sizes or ('224', 'coco')))
    elif args.what == 'crossover':
        crossover(args.repeats)
    elif args.what == 'block-rows':
        block_rows(args.repeats)
    elif args.what == 'eomt-masks':
        eomt_masks(args.repeats)
    else:
        peak(args.repeats, tuple(args.sizes or ('224', '512')), tuple(args.families))


if __name__ == '__main__':
    main()
