"""Inference time per image of whole mmseg segmentors, side by side in one process: e.g. EoMT
against Mask2Former over ViT-Adapter on the same ViT.

    python -m benchmarks.benchmark_segmentor_inference \\
        configs/vit/eomt_vit-l-p16-dinov2_4xb4-39k_ade20k-512x512.py \\
        configs/vit/mask2former_vit-adapter-l-p16-dinov2_8xb2-160k_ade20k-896x896.py --img-size 512

Each config's model is built as deployed (random weights, no weight file read: the time
does not depend on them) and runs ``predict`` on one random image of ``--img-size``
(whole-image inference, no sliding window, no flip), interleaved with the others
(benchmark_lib.time_interleaved). An EoMT model runs as trained: its masks annealed away
(probability 0 in every block), so the blocks run unmasked and one prediction is made.
Prints one markdown row per config: median ms per image and the ratio to the first config's.
"""
from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch
from mmengine.config import Config
from mmengine.structures import PixelData
from mmseg.structures import SegDataSample

from benchmarks import benchmark_lib
from vitdense.model_factory import build_model, register_host
from vitdense.models.eomt import EoMT


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('configs', nargs='+', help='mmseg configs (the first is the reference)')
    parser.add_argument('--img-size', type=int, default=512, help='square input size')
    parser.add_argument('--threads', type=int, default=benchmark_lib.default_threads())
    parser.add_argument('--repeats', type=int, default=3)
    return parser.parse_args()


def without_pretrained(node: Any) -> Any:
    """A config node with every ``Pretrained`` ``init_cfg`` removed (no weight files)."""
    if isinstance(node, dict):
        return {key: without_pretrained(value) for key, value in node.items()
                if not (key == 'init_cfg' and isinstance(value, dict)
                        and value.get('type') == 'Pretrained')}
    if isinstance(node, (list, tuple)):
        return type(node)(without_pretrained(value) for value in node)
    return node


def inference_step(config: str, img_size: int) -> benchmark_lib.Step:
    """``predict`` of the config's segmentor on one random image, masks annealed away."""
    cfg = Config.fromfile(config)
    cfg.model = without_pretrained(cfg.model.to_dict())
    register_host(cfg)
    model = build_model(cfg, 'deploy').eval().requires_grad_(False)
    for module in model.modules():
        if isinstance(module, EoMT):
            module.set_mask_probabilities([0.0] * len(module.mask_probabilities))
    image = torch.randn(1, 3, img_size, img_size)
    sample = SegDataSample(metainfo=dict(img_shape=(img_size, img_size),
                                         ori_shape=(img_size, img_size),
                                         pad_shape=(img_size, img_size)))
    sample.gt_sem_seg = PixelData(data=torch.zeros(1, img_size, img_size, dtype=torch.long))

    def step() -> None:
        with torch.no_grad():
            model.predict(image, [sample])

    return step


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    steps = {config: inference_step(config, args.img_size) for config in args.configs}
    samples = benchmark_lib.time_interleaved(steps, warmup=1, repeats=args.repeats,
                                             min_repeat_s=0.)
    medians = {config: statistics.median(times) * 1e3 for config, times in samples.items()}
    reference = medians[args.configs[0]]
    print(f'{args.img_size}² image, {args.threads} thread(s), median of {args.repeats}\n')
    print('| config | ms / image | ratio |\n|---|---|---|')
    for config, ms in medians.items():
        print(f'| `{config}` | {ms:.0f} | {ms / reference:.2f} |')


if __name__ == '__main__':
    main()
