"""Parameters and FLOPs of the model of any config (classifier, detector or segmentor).

FLOPs are multiply-accumulates of convolutions, matrix products and attention (torch's
``FlopCounterMode`` counts 2 per multiply-add; we halve it), the convention of the ViT,
DeiT, CaiT, XCiT and ConViT papers; norms, activations and pooling are not counted. The
forward is the model's ``mode='tensor'`` pass on one image: a classifier's logits, a
segmentor's decode head (no auxiliary head, as at test time), a detector's backbone, neck,
RPN and RoI heads on the RPN's proposals of random weights (so its FLOPs vary slightly).

    python tools/analysis_tools/get_flops.py configs/xcit/xcit-s12-p16_8xb128_in1k.py
    python tools/analysis_tools/get_flops.py \\
        configs/xcit/mask-rcnn_xcit-s12-p16_fpn_3x_coco.py --shape 800 1280
"""
from __future__ import annotations

import argparse
import json

import torch
from mmengine.config import Config
from mmengine.registry import MODELS, DefaultScope
from torch.utils.flop_counter import FlopCounterMode

from vitdense.engine.launch import host_of

#: input size (H, W) per host library when --shape is not given: the classification
#: pipeline's crop, the mmdet convention for COCO, the ADE20k training crop
DEFAULT_SHAPES = {'mmdet': (800, 1280), 'mmseg': (512, 512)}


def load_config(config: str) -> Config:
    cfg = Config.fromfile(config)
    host_of(cfg)
    return cfg


def build_model(cfg: Config, device: str = 'cpu') -> torch.nn.Module:
    """The config's model without its pretrained weights (they are not needed to count)."""
    model_cfg = cfg.model.copy()
    if model_cfg.get('backbone', {}).get('init_cfg') is not None:
        model_cfg.backbone.init_cfg = None
    with DefaultScope.overwrite_default_scope(cfg.default_scope), torch.device(device):
        return MODELS.build(model_cfg)


def classification_shape(cfg: Config) -> tuple[int, int]:
    """The crop of the test pipeline (the resolution the paper reports the model at)."""
    for step in cfg.test_dataloader.dataset.pipeline:
        if step.type == 'CenterCrop':
            size = step.crop_size
            return (size, size) if isinstance(size, int) else tuple(size)
    raise KeyError('no CenterCrop in the test pipeline: pass --shape H W')


def default_shape(cfg: Config) -> tuple[int, int]:
    if cfg.default_scope in DEFAULT_SHAPES:
        return DEFAULT_SHAPES[cfg.default_scope]
    return classification_shape(cfg)


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _detector_samples(shape: tuple[int, int]) -> list:
    from mmdet.structures import DetDataSample
    return [DetDataSample(metainfo=dict(img_shape=shape, ori_shape=shape, pad_shape=shape,
                                        batch_input_shape=shape, scale_factor=(1., 1.)))]


@torch.no_grad()
def count_flops(model: torch.nn.Module, cfg: Config, shape: tuple[int, int]) -> int:
    """Multiply-accumulates of one ``mode='tensor'`` forward of a (1, 3, H, W) image."""
    model.eval()
    for param in model.parameters():  # FlopCounterMode's module tracker hooks grad-less inputs
        param.requires_grad_(False)
    images = torch.randn(1, 3, *shape)
    samples = _detector_samples(shape) if cfg.default_scope == 'mmdet' else None
    counter = FlopCounterMode(display=False)
    with counter:
        model(images, samples, mode='tensor')
    return counter.get_total_flops() // 2


def analyse(config: str, shape: tuple[int, int] | None = None) -> dict:
    cfg = load_config(config)
    shape = tuple(shape) if shape else default_shape(cfg)
    model = build_model(cfg)
    return dict(config=config, shape=list(shape), params=count_parameters(model),
                flops=count_flops(model, cfg, shape))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config')
    parser.add_argument('--shape', type=int, nargs=2, metavar=('H', 'W'),
                        help='input size; default: the classification test crop, '
                             '800 x 1280 for detection, 512 x 512 for segmentation')
    parser.add_argument('--json', action='store_true', help='print one JSON line')
    args = parser.parse_args()
    result = analyse(args.config, args.shape)
    if args.json:
        print(json.dumps(result))
        return
    height, width = result['shape']
    print(f'{args.config}\ninput: 3 x {height} x {width}\n'
          f'params: {result["params"] / 1e6:.2f} M\nFLOPs: {result["flops"] / 1e9:.2f} G')


if __name__ == '__main__':
    main()
