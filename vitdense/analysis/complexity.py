"""Parameters and FLOPs of the model of any config (classifier, detector or segmentor).

FLOPs are multiply-accumulates of convolutions, matrix products and attention (torch's
``FlopCounterMode`` counts 2 per multiply-add; we halve it), the convention of the ViT,
DeiT, CaiT, XCiT and ConViT papers; norms, activations and pooling are not counted. The
model is built and run on the meta device (shapes only: no memory, no arithmetic), one
image: a classifier's logits, a segmentor's decode head (no auxiliary head, as at test
time), a detector's backbone, neck and RPN plus its box head on ``test_cfg.rpn.max_per_img``
proposals and its mask head on ``test_cfg.rcnn.max_per_img`` boxes (the most a test image
gets; RoIAlign itself has no multiply-adds).

Command line: ``tools/analysis_tools/get_flops.py``.
"""
from __future__ import annotations

import torch
from mmengine.config import Config
from mmengine.registry import MODELS, DefaultScope
from torch.utils.flop_counter import FlopCounterMode

from vitdense.engine.launch import host_of


def load_config(config: str) -> Config:
    cfg = Config.fromfile(config)
    host_of(cfg)
    return cfg


def build_model(cfg: Config, device: str = 'meta') -> torch.nn.Module:
    """The config's model as deployed: no pretrained weights (not needed to count) and no
    distillation teacher (a training-time helper, kept out of the student's checkpoints)."""
    model_cfg = cfg.model.copy()
    model_cfg.pop('teacher', None)
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


def detection_shape(cfg: Config) -> tuple[int, int]:
    """The test pipeline's resize of a landscape image (mmdet's (long, short) scale, e.g.
    1333 × 800 for COCO), padded as the data preprocessor pads the batch (800 × 1344)."""
    for step in cfg.test_dataloader.dataset.pipeline:
        if step.type == 'Resize':
            short, long = sorted(step.scale)
            divisor = cfg.model.data_preprocessor.get('pad_size_divisor', 1)
            return (-(-short // divisor) * divisor, -(-long // divisor) * divisor)
    raise KeyError('no Resize in the test pipeline: pass --shape H W')


def default_shape(cfg: Config) -> tuple[int, int]:
    """Classifiers: the test crop; detectors: the test resize; segmentors: the training crop
    the data preprocessor pads to (512 × 512 on ADE20k)."""
    if cfg.default_scope == 'mmdet':
        return detection_shape(cfg)
    if cfg.default_scope == 'mmseg':
        return tuple(cfg.model.data_preprocessor.size)
    return classification_shape(cfg)


def count_parameters(model: torch.nn.Module) -> int:
    """How many numbers the model's parameters hold."""
    return sum(p.numel() for p in model.parameters())


def _run_detector(model: torch.nn.Module, cfg: Config, images: torch.Tensor) -> None:
    """Backbone, neck and RPN on the image; box and mask heads on the most RoIs a test
    image can have (their features are RoIAlign outputs: only their shape matters)."""
    features = model.extract_feat(images)
    model.rpn_head(features)
    roi_head, test_cfg = cfg.model.roi_head, cfg.model.test_cfg
    for head, extractor, count in (
            (model.roi_head.bbox_head, roi_head.bbox_roi_extractor, test_cfg.rpn.max_per_img),
            (model.roi_head.mask_head, roi_head.mask_roi_extractor, test_cfg.rcnn.max_per_img)):
        size = extractor.roi_layer.output_size
        size = (size, size) if isinstance(size, int) else tuple(size)
        head(images.new_zeros(count, extractor.out_channels, *size))


@torch.no_grad()
def count_flops(model: torch.nn.Module, cfg: Config, shape: tuple[int, int]) -> int:
    """Multiply-accumulates of one forward of a (1, 3, H, W) image (see the module doc)."""
    model.eval()
    for param in model.parameters():  # FlopCounterMode's module tracker hooks grad-less inputs
        param.requires_grad_(False)
    device = next(model.parameters()).device
    images = torch.randn(1, 3, *shape, device=device)
    counter = FlopCounterMode(display=False)
    with counter:
        if cfg.default_scope == 'mmdet':
            _run_detector(model, cfg, images)
        else:
            model(images, None, mode='tensor')
    return counter.get_total_flops() // 2


def analyse(config: str, shape: tuple[int, int] | None = None) -> dict:
    """``config``'s parameter count and FLOPs at ``shape`` (default: :func:`default_shape`)."""
    cfg = load_config(config)
    shape = tuple(shape) if shape else default_shape(cfg)
    model = build_model(cfg, device='meta')
    return dict(config=config, shape=list(shape), params=count_parameters(model),
                flops=count_flops(model, cfg, shape))
