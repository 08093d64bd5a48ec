"""Deployment: our backbones, segmentors and Mask R-CNN as tensor-in / tensor-out graphs,
exported with torch's exporter (ONNX, ``torch.export``) and run again to check them.

Imports mmdet / mmseg only through the models handed to it; exporting to ONNX and running
the file need ``onnx``, ``onnxscript`` and ``onnxruntime`` (``bash tools/install.sh
--deploy``).
"""
from __future__ import annotations

import torch.nn as nn

from ..models.backbones.base import ColumnarBackbone
from .export import (FORMATS, MIN_SIDE, SUFFIXES, ExportedModel, dynamic_image_shapes,
                     export_module, max_abs_differences)
from .graphs import MaskRCNNGraph, Normalize, SegmentorGraph, paste_masks

PARTS = ('model', 'backbone')

__all__ = ['PARTS', 'FORMATS', 'MIN_SIDE', 'SUFFIXES', 'ExportedModel', 'MaskRCNNGraph',
           'Normalize', 'SegmentorGraph', 'deployable', 'dynamic_image_shapes',
           'export_module', 'max_abs_differences', 'paste_masks']


def deployable(model: nn.Module, part: str = 'model') -> tuple[nn.Module, str]:
    """The graph to export for ``model`` and its kind ('backbone', 'segmentor',
    'mask-rcnn').

    ``part='backbone'`` takes the model's backbone (or the model, if it is one): normalised
    images in, the dense feature maps out. ``part='model'`` takes the whole model: an mmseg
    encoder-decoder or an mmdet Mask R-CNN wrapped to take the image as loaded.
    """
    if part not in PARTS:
        raise ValueError(f'unknown part {part!r}; expected one of {PARTS}')
    backbone = model if isinstance(model, ColumnarBackbone) else getattr(model, 'backbone', None)
    if part == 'backbone' or model is backbone:
        if not isinstance(backbone, ColumnarBackbone):
            raise ValueError(f'{type(model).__name__} has no vitdense backbone to export '
                             f'(found {type(backbone).__name__})')
        if not backbone.dense:
            raise ValueError(f"the backbone's out_type is {backbone.out_type!r}; the "
                             f"exported backbone gives the dense maps (out_type='featmap')")
        return backbone.eval(), 'backbone'
    if hasattr(model, 'decode_head'):
        return SegmentorGraph(model).eval(), 'segmentor'
    if hasattr(model, 'roi_head'):
        return MaskRCNNGraph(model).eval(), 'mask-rcnn'
    raise ValueError(f'{type(model).__name__}: exported models are mmseg encoder-decoders '
                     f'(UperNet, Semantic FPN) and mmdet Mask R-CNN, or part=backbone')

