"""What a refused load's advice check costs: CPU time and the rise of peak resident memory.

A refusal checks its advice by loading the file's tensors into the advised model (built on
the meta device) and running a small forward and backward
(``vitdense.models.backbones.checkpoint_diagnosis.forward_refusal``). The file here is
timm's ``vit_large_patch14_dinov2`` layout (304M parameters, random tensors) in each dtype,
refused by ``ViT('large', patch_size=14, img_size=518, out_type='cls_token')`` (no
LayerScale); each dtype runs in a process of its own, so that each peak is its own.
``--as-float32`` checks 16-bit files on a float32 copy, for comparison.

    python -m benchmarks.refusal_check_cost
    python -m benchmarks.refusal_check_cost --dtypes bfloat16 --as-float32
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

DTYPES = ('float32', 'bfloat16', 'float16')


def measure(dtype: str, as_float32: bool, size: str = 'large') -> dict:
    """The check's CPU seconds and peak-memory rise (MB) for a file of ``dtype`` of DINOv2's
    ViT of ``size`` (timm's layout)."""
    import timm

    from vitdense.models import ViT, adapt_checkpoint
    from vitdense.models.backbones import checkpoint_diagnosis
    if as_float32:
        checkpoint_diagnosis.check_dtype = lambda tensors: torch.float32
    with torch.device('meta'):
        source = timm.create_model(f'vit_{size}_patch14_dinov2', pretrained=False, img_size=518)
        model = ViT(size, patch_size=14, img_size=518, out_type='cls_token')
    generator = torch.Generator().manual_seed(0)
    saved = {key: (torch.randn(value.shape, generator=generator) * .02).to(getattr(torch, dtype))
             for key, value in source.state_dict().items()}
    before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.process_time()
    try:
        adapt_checkpoint(model, saved)
    except ValueError as refused:
        advice = str(refused).split('to load it: ')[1].split('\n')[0]
    else:
        raise RuntimeError('the load was not refused')
    return dict(dtype=dtype, as_float32=as_float32, file_mb=round(sum(
        t.numel() * t.element_size() for t in saved.values()) / 2 ** 20),
        cpu_s=round(time.process_time() - start, 2),
        peak_rise_mb=round((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024),
        advice=advice)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--dtypes', nargs='+', choices=DTYPES, default=list(DTYPES))
    parser.add_argument('--as-float32', action='store_true',
                        help='check 16-bit files on a float32 copy as well')
    parser.add_argument('--one', choices=DTYPES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.as_float32)))
        return
    runs = [(dtype, False) for dtype in args.dtypes] + [
        (dtype, True) for dtype in args.dtypes if args.as_float32 and dtype != 'float32']
    for dtype, as_float32 in runs:
        command = [sys.executable, '-m', 'benchmarks.refusal_check_cost', '--one', dtype] + (
            ['--as-float32'] if as_float32 else [])
        result = json.loads(subprocess.run(command, check=True, capture_output=True,
                                           text=True).stdout.strip().splitlines()[-1])
        print(f"{result['dtype']:>9} file {result['file_mb']:>5} MB"
              f"{' (checked as float32)' if as_float32 else '':>22}: check {result['cpu_s']} s "
              f"CPU, peak memory +{result['peak_rise_mb']} MB; advice: {result['advice'][:60]}")


if __name__ == '__main__':
    main()
