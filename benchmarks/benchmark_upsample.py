"""The pyramid's 2×2 stride-2 transposed convolution against the matrix product it is.

    python -m benchmarks.benchmark_upsample [--width 768] [--grid 25 42] [--batch 1]
        [--threads N] [--repeats 5] [--out work_dirs/benchmark_upsample.json]

A 2×2 stride-2 transposed convolution of a (B, C, H, W) map writes four outputs per input
pixel from four disjoint (C, C_out) slices of its weight, so it is one (4·C_out, C) × (C, H·W)
product per image followed by a pixel shuffle. Both forms are timed on the same weights in
one run (``benchmark_lib.time_interleaved``): forward alone and forward + backward (a loss
over the output), at the multi-layer pyramid's two steps (the patch grid to stride 8, then
stride 8 to stride 4: ``--grid`` and twice it), with the largest difference of their outputs
and gradients.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks import benchmark_lib as bm


def matmul_form(x: torch.Tensor, conv: nn.ConvTranspose2d) -> torch.Tensor:
    """``conv(x)`` as one batched matrix product and a pixel shuffle."""
    batch, _, height, width = x.shape
    out_channels = conv.out_channels
    weight = conv.weight.flatten(1).t()  # (C, C_out, 2, 2) -> (C_out · 4, C)
    bias = conv.bias.repeat_interleave(4)[:, None]
    y = torch.baddbmm(bias.expand(batch, -1, -1), weight.expand(batch, -1, -1), x.flatten(2))
    return F.pixel_shuffle(y.view(batch, out_channels * 4, height, width), 2)


def _steps(conv: nn.ConvTranspose2d, x: torch.Tensor) -> dict[str, Callable[[], None]]:
    def forward(fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def step() -> None:
            with torch.no_grad():
                fn()
        return step

    def training(fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def step() -> None:
            fn().square().mean().backward()
            conv.zero_grad(set_to_none=True)
            x.grad = None
        return step
    forms = {'conv_transpose': lambda: conv(x), 'matmul': lambda: matmul_form(x, conv)}
    return {**{f'{name} forward': forward(fn) for name, fn in forms.items()},
            **{f'{name} forward+backward': training(fn) for name, fn in forms.items()}}


def _differences(conv: nn.ConvTranspose2d, x: torch.Tensor) -> dict[str, float]:
    """Largest absolute difference of the two forms' output and gradients, and the
    output's largest magnitude (the scale they compare at)."""
    results = {}
    for name, fn in (('conv_transpose', conv), ('matmul', lambda t: matmul_form(t, conv))):
        out = fn(x)
        grads = torch.autograd.grad(out.square().mean(), (x, conv.weight, conv.bias))
        results[name] = (out.detach(), *grads)
    return {f'max_abs_diff_{part}': (a - b).abs().max().item()
            for part, a, b in zip(('out', 'dx', 'dweight', 'dbias'), *results.values())} | \
        dict(max_abs_out=results['conv_transpose'][0].abs().max().item())


def measure(width: int, grid: tuple[int, int], batch: int, repeats: int) -> dict:
    """Both forms at one size: seconds per call and their differences."""
    torch.manual_seed(0)
    conv = nn.ConvTranspose2d(width, width, 2, stride=2)
    x = torch.randn(batch, width, *grid, requires_grad=True)
    samples = bm.time_interleaved(_steps(conv, x), warmup=1, repeats=repeats)
    medians = {name: sorted(times)[len(times) // 2] for name, times in samples.items()}
    ratios = {f'matmul / conv_transpose {kind}': bm.paired_ratio(
        samples[f'matmul {kind}'], samples[f'conv_transpose {kind}'])
        for kind in ('forward', 'forward+backward')}
    return dict(width=width, grid=list(grid), batch=batch,
                ms={name: 1e3 * s for name, s in medians.items()}, ratios=ratios,
                **_differences(conv, x))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--width', type=int, default=768)
    parser.add_argument('--grid', type=int, nargs=2, default=(25, 42), metavar=('H', 'W'),
                        help='the first step\'s input grid; the second step runs at twice it')
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--threads', type=int, default=bm.default_threads())
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--out', type=Path, help='write the results here (JSON)')
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    grids = [tuple(args.grid), (2 * args.grid[0], 2 * args.grid[1])]
    results = [measure(args.width, grid, args.batch, args.repeats) for grid in grids]
    for result in results:
        print(json.dumps(result))
    if args.out:
        bm.write_json(args.out, bm.environment('cpu', args.threads), results)


if __name__ == '__main__':
    main()
