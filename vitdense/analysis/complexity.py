"""Parameters, FLOPs and multiply-adds of a model, and of any config's model (classifier,
detector or segmentor).

One meaning each: :func:`count_flops` counts FLOPs, 2 per multiply-add (torch's
``FlopCounterMode`` convention, used by the benchmarks); :func:`count_multiply_adds` counts
multiply-adds, FLOPs divided by :data:`FLOPS_PER_MULTIPLY_ADD`, the number the ViT, DeiT,
CaiT, XCiT and ConViT papers call "FLOPs" and that ``model-index.yml`` records. Both count
convolutions, matrix products and attention (torch's CPU flash-attention kernels included);
norms, activations and pooling are not counted. Talking heads are counted written out (the
architecture's products, as the papers count them), not as the fused call that does heads ×
those products; GPSA's positional term is counted as it runs, separable along the grid.
Multiply-adds leave out a learned position table's resampling to the input's grid (it
prepares a parameter, and at the table's own grid it is the identity).

:func:`analyse` counts a config's model built and run on the meta device (shapes only: no
memory, no arithmetic), one image: a classifier's logits, a segmentor's decode head (no
auxiliary head, as at test time), a detector's backbone, neck and RPN plus its box head on
``test_cfg.rpn.max_per_img`` proposals and its mask head on ``test_cfg.rcnn.max_per_img``
boxes (the most a test image gets; RoIAlign itself has no multiply-adds); a detector without
RPN whose backbone makes the predictions (EoMT), its backbone (and neck); Mask2Former's
backbone and its head with its queries (not the panoptic fusion of its outputs).

Command line: ``tools/analysis_tools/get_flops.py``.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Iterable

import torch
from mmengine.config import Config
from mmengine.registry import MODELS, DefaultScope
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from vitdense.model_factory import build_model, register_host
from vitdense.models.layers.embed import LearnedPositionEmbedding
from vitdense.models.layers.talking_heads import forced_path

#: FLOPs of one multiply-add (a multiplication and an addition)
FLOPS_PER_MULTIPLY_ADD = 2


def load_config(config: str) -> Config:
    """Read ``config`` and register its host library."""
    cfg = Config.fromfile(config)
    register_host(cfg)
    return cfg


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


def _run_query_head(model: torch.nn.Module, cfg: Config, features: tuple) -> None:
    """Mask2Former's head (pixel decoder, query decoder, class and mask predictions) on the
    features: mmdet's panoptic head or mmseg's decode head. mmcv's deformable attention reads
    the levels' shapes as numbers, which meta tensors do not hold: on the meta device the
    head runs on the CPU, a copy built from its config, on random features of the backbone's
    shapes; its forward reads no sample."""
    name = 'panoptic_head' if cfg.default_scope == 'mmdet' else 'decode_head'
    head = getattr(model, name)
    if any(param.is_meta for param in head.parameters()):
        with DefaultScope.overwrite_default_scope(cfg.default_scope), torch.device('cpu'):
            head = MODELS.build(cfg.model[name]).eval()
        features = tuple(torch.randn(feature.shape) for feature in features)
    with torch.no_grad():
        head(features, [])


#: a query head's multiply-adds by (head config, feature shapes): the same for every
#: backbone whose maps have those shapes (a run on the CPU each: counted once a process)
_QUERY_HEAD_COUNTS: dict[str, int] = {}


def _query_head_multiply_adds(model: torch.nn.Module, cfg: Config, features: tuple) -> int:
    """Multiply-adds of :func:`_run_query_head` on ``features``."""
    name = 'panoptic_head' if cfg.default_scope == 'mmdet' else 'decode_head'
    key = json.dumps([cfg.model[name].to_dict(), [list(f.shape) for f in features]],
                     sort_keys=True, default=str)
    if key not in _QUERY_HEAD_COUNTS:
        _QUERY_HEAD_COUNTS[key] = count_multiply_adds(
            lambda: _run_query_head(model, cfg, features))
    return _QUERY_HEAD_COUNTS[key]


def _run_detector(model: torch.nn.Module, cfg: Config, images: torch.Tensor) -> None:
    """Backbone, neck and RPN on the image (EoMT: its backbone alone, which predicts the
    classes and masks); box and mask heads on the most RoIs a test image can have (their
    features are RoIAlign outputs: only their shape matters). A
    cascade runs every stage's box head on the proposals and every stage's mask head on
    the detections (mmdet averages the stages' masks). Mask2Former:
    :func:`_query_head_multiply_adds`."""
    features = model.extract_feat(images)
    if cfg.model.backbone.type == 'vitdense.EoMT':  # its class and mask logits are the heads'
        return
    model.rpn_head(features)
    roi_head, test_cfg = cfg.model.roi_head, cfg.model.test_cfg
    for heads, extractor, count in (
            (model.roi_head.bbox_head, roi_head.bbox_roi_extractor, test_cfg.rpn.max_per_img),
            (model.roi_head.mask_head, roi_head.mask_roi_extractor, test_cfg.rcnn.max_per_img)):
        size = extractor.roi_layer.output_size
        size = (size, size) if isinstance(size, int) else tuple(size)
        for head in heads if isinstance(heads, torch.nn.ModuleList) else [heads]:
            head(images.new_zeros(count, extractor.out_channels, *size))


def _cpu_flash_forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
    # FlopCounterMode passes the shapes of tensor arguments
    return sdpa_flop_count(query, key, value)


def _cpu_flash_backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


def _flop_formulas() -> dict:
    """Fused attention kernels that ``FlopCounterMode`` does not know (the CPU ones)."""
    aten = torch.ops.aten
    formulas = {}
    if hasattr(aten, '_scaled_dot_product_flash_attention_for_cpu'):
        formulas[aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_flash_forward
        formulas[aten._scaled_dot_product_flash_attention_for_cpu_backward] = \
            _cpu_flash_backward
    return formulas


def count_flops(step: Callable[[], Any], left_out: Iterable[torch.nn.Module] = ()) -> int:
    """FLOPs of one call of ``step``, 2 per multiply-add (see the module doc), less those
    computed inside the modules ``left_out``."""
    inside: list[int] = []  # the running total entering (negated) and leaving each module
    with FlopCounterMode(display=False, custom_mapping=_flop_formulas()) as counter:
        hooks = [hook for module in left_out for hook in (
            module.register_forward_pre_hook(
                lambda *_: inside.append(-counter.get_total_flops())),
            module.register_forward_hook(lambda *_: inside.append(counter.get_total_flops())))]
        try:
            step()
        finally:
            for hook in hooks:
                hook.remove()
    return counter.get_total_flops() - sum(inside)


def count_multiply_adds(step: Callable[[], Any],
                        left_out: Iterable[torch.nn.Module] = ()) -> int:
    """Multiply-adds of one call of ``step``: :func:`count_flops` over
    :data:`FLOPS_PER_MULTIPLY_ADD`."""
    return count_flops(step, left_out) // FLOPS_PER_MULTIPLY_ADD


def position_tables(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The learned position tables of ``model``: what the papers' counts leave out (their
    resampling to the input's grid prepares a parameter)."""
    return [module for module in model.modules() if isinstance(module, LearnedPositionEmbedding)]


@torch.no_grad()
def forward_multiply_adds(model: torch.nn.Module, cfg: Config, shape: tuple[int, int]) -> int:
    """Multiply-adds of one test-time forward of a (1, 3, H, W) image (see the module doc)."""
    model.eval()
    for param in model.parameters():  # FlopCounterMode's module tracker hooks grad-less inputs
        param.requires_grad_(False)
    device = next(model.parameters()).device
    images = torch.randn(1, 3, *shape, device=device)
    tables = position_tables(model)
    model_cfg = cfg.get('model', {})  # a bare backbone's count has no model config
    # EoMT's backbone makes the predictions its Mask2Former head only scores
    eomt = model_cfg.get('backbone', {}).get('type') == 'vitdense.EoMT'
    with forced_path(model, 'maps'):
        if not eomt and ('panoptic_head' in model_cfg or
                         model_cfg.get('decode_head', {}).get('type') == 'Mask2FormerHead'):
            features = []
            backbone = count_multiply_adds(
                lambda: features.extend(model.extract_feat(images)), tables)
            return backbone + _query_head_multiply_adds(model, cfg, tuple(features))
        if cfg.default_scope == 'mmdet':
            return count_multiply_adds(lambda: _run_detector(model, cfg, images), tables)
        return count_multiply_adds(lambda: model(images, None, mode='tensor'), tables)


def analyse(config: str, shape: tuple[int, int] | None = None) -> dict:
    """``config``'s parameter count and multiply-adds at ``shape`` (default:
    :func:`default_shape`); the latter under the key ``flops``, the model index's name for
    them."""
    cfg = load_config(config)
    shape = tuple(shape) if shape else default_shape(cfg)
    model = build_model(cfg, 'count', device='meta')
    return dict(config=config, shape=list(shape), params=count_parameters(model),
                flops=forward_multiply_adds(model, cfg, shape))
