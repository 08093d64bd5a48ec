"""Memory of one training step of a config's whole model (backbone, neck, heads) at its
largest training input, on a GPU, in float32 and under mixed precision; and the time of the
step on this machine. How it counts: :mod:`vitdense.analysis.memory`.

    python tools/analysis_tools/memory.py configs/cait/mask-rcnn_cait-s24-p16_fpn_3x_coco.py
    python tools/analysis_tools/memory.py CONFIG --batch 2 --shape 800 1344 --amp --time
    python tools/analysis_tools/memory.py configs/vit/vit-l-p16_8xb256-a2_in1k.py --fsdp 8
    python tools/analysis_tools/memory.py CONFIG... --lora-vs-full --batch 2   # docs/memory.md
"""
from __future__ import annotations

import argparse
import json
from typing import Optional

from vitdense.analysis.memory import GIB, account, lora_and_full, time_step


def _gib(value: float) -> str:
    return f'{value / GIB:.2f} GiB'


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('configs', nargs='+', metavar='CONFIG')
    parser.add_argument('--batch', type=int, help='images per GPU (default: the config\'s)')
    parser.add_argument('--shape', type=int, nargs=2, metavar=('H', 'W'),
                        help='input size (default: the largest training input)')
    parser.add_argument('--amp', action='store_true', help='mixed precision only')
    parser.add_argument('--fp32', action='store_true', help='float32 only')
    parser.add_argument('--objects', type=int, default=8, help='boxes per image (detection)')
    parser.add_argument('--time', action='store_true',
                        help='also time one real float32 step on this CPU (slow)')
    parser.add_argument('--fsdp', type=int, default=1, metavar='GPUS',
                        help='per-GPU figure of a fully sharded run over GPUS GPUs '
                             '(parameters, gradients, optimizer state split; activations not)')
    parser.add_argument('--json', action='store_true', help='print one JSON line per config')
    parser.add_argument('--lora-vs-full', action='store_true',
                        help='LoRA (the config\'s, else rank 16 on qkv, proj, fc1, fc2) against '
                             'full fine-tuning, in the config\'s precision: one table row each')
    args = parser.parse_args(argv)
    if args.amp and args.fp32:
        parser.error('--amp and --fp32 exclude each other')
    if args.fsdp < 1:
        parser.error(f'--fsdp {args.fsdp}: the number of GPUs is at least 1')
    amp = True if args.amp else False if args.fp32 else None
    if args.lora_vs_full:
        print(LORA_HEADER)
        for config in args.configs:
            result = lora_and_full(config, args.batch or 2, amp, args.objects)
            print(json.dumps(result) if args.json else lora_row(result), flush=True)
        return
    for config in args.configs:
        result = account(config, args.batch, args.shape, amp, args.objects,
                         fsdp_world_size=args.fsdp)
        if args.time:
            result['step_s'] = time_step(config, result['batch'], tuple(result['shape']),
                                         objects=args.objects)
        print(json.dumps(result) if args.json else report(result), flush=True)


LORA_HEADER = ('| config | precision | LoRA: weights / gradients / optimizer / activations / '
               'peak (GiB) | full: the same | LoRA gradients + optimizer, % of full (backbone) | '
               'checkpoint LoRA / full |\n|---|---|---|---|---|---|')


def lora_row(result: dict) -> str:
    """One row of the LoRA-against-full table (LORA_HEADER)."""
    precision = result['precision']

    def split(entry: dict) -> str:
        return ' / '.join(f'{value / GIB:.2f}' for value in (
            entry['params'], entry['grads'], entry['optimizer'],
            entry[precision]['activations'], entry[precision]['peak']))

    return (f'| {result["config"].split("/")[-1]} | {precision} | {split(result["lora"])} | '
            f'{split(result["full"])} | {100 * result["trained_share"]:.1f} % '
            f'({100 * result["backbone_trained_share"]:.1f} %) | '
            f'{100 * result["checkpoint_share"]:.1f} % |')


def report(result: dict) -> str:
    """The account as lines of text."""
    height, width = result['shape']
    lines = [f'{result["config"]}\ninput: {result["batch"]} x 3 x {height} x {width}, '
             f'with_cp={result["with_cp"]}, config AMP: {result["config_amp"]}\n'
             f'parameters {_gib(result["params"])}, gradients {_gib(result["grads"])}, '
             f'optimizer state {_gib(result["optimizer"])}']
    if 'fsdp' in result:
        fsdp = result['fsdp']
        lines.append(f'FSDP over {fsdp["world_size"]} GPUs, per GPU: parameters '
                     f'{_gib(fsdp["params"])}, gradients {_gib(fsdp["grads"])}, optimizer state '
                     f'{_gib(fsdp["optimizer"])}, gathered blocks {_gib(fsdp["gathered"])}')
    for precision in ('fp32', 'amp'):
        if precision in result:
            entry = result[precision]
            lines.append(f'{precision}: activations {_gib(entry["activations"])}, '
                         f'peak {_gib(entry["peak"])}')
    if 'step_s' in result:
        lines.append(f'step time (float32, this CPU): {result["step_s"]:.1f} s')
    return '\n'.join(lines)


if __name__ == '__main__':
    main()
