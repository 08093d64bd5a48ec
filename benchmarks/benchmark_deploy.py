"""Inference latency of exported models: PyTorch eager against onnxruntime on the same file,
interleaved (benchmark_lib.time_interleaved), on the same image and thread count.

    python -m benchmarks.benchmark_deploy \\
        --model configs/xcit/upernet_xcit-d6-p8_demo-ade.py CKPT upernet_xcit.onnx \\
        --model configs/xcit/mask-rcnn_xcit-d6-p8_fpn_demo-coco.py CKPT mask-rcnn_xcit.onnx

Each ``--model CONFIG CHECKPOINT FILE`` names an exported file (tools/deployment/export.py)
and the checkpoint it came from; PyTorch runs the same graph module eagerly (for a backbone
file, add ``--part backbone``). The image is the first validation image of the config (or
``--image``), at its own size. Prints one markdown row per model: median ms per image of each
and their paired ratio.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
from mmengine.config import Config

from benchmarks import benchmark_lib
import vitdense  # noqa: F401  (vitdense registries)
from vitdense.deploy import PARTS, ExportedModel, deployable
from vitdense.deploy.inputs import graph_input, sample_images
from vitdense.model_factory import build_model


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--model', nargs=3, action='append', required=True,
                        metavar=('CONFIG', 'CHECKPOINT', 'FILE'))
    parser.add_argument('--part', choices=PARTS, default='model')
    parser.add_argument('--image', nargs='+', default=[], help='image (default: validation)')
    parser.add_argument('--threads', type=int, default=benchmark_lib.default_threads(),
                        help='threads of both runtimes (default: the cores of this process)')
    parser.add_argument('--repeats', type=int, default=7)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    env = benchmark_lib.environment('cpu', args.threads)
    print(f"CPU: {env['cpu']}, {args.threads} threads, torch {env['torch']}, load average "
          f"{env['load_average'][0]:.1f}\n")
    print('| model | input | PyTorch eager ms | onnxruntime ms | onnxruntime / PyTorch |')
    print('|---|---|---|---|---|')
    for config, checkpoint, path in args.model:
        cfg = Config.fromfile(config)
        model = build_model(cfg, 'deploy', None if checkpoint == 'none' else checkpoint)
        graph, kind = deployable(model, args.part)
        x = graph_input(kind, model, sample_images(cfg, args.image, 1)[0])
        exported = ExportedModel(path, threads=args.threads)

        def eager() -> None:
            with torch.no_grad():
                graph(x)

        samples = benchmark_lib.time_interleaved(
            {'pytorch': eager, 'onnxruntime': lambda: exported(x)}, repeats=args.repeats)
        ms = {name: 1e3 * statistics.median(times) for name, times in samples.items()}
        ratio = benchmark_lib.paired_ratio(samples['onnxruntime'], samples['pytorch'])
        print(f'| {Path(config).stem} ({kind}) | {x.shape[2]}×{x.shape[3]} | '
              f'{ms["pytorch"]:.1f} | {ms["onnxruntime"]:.1f} | {ratio:.2f} |', flush=True)


if __name__ == '__main__':
    main()
