"""Frozen-backbone probes of dense features (DINOv2, Oquab et al. 2023, §7.3).

``FrozenBackboneSegmentor`` trains its heads only: the backbone stays in eval mode, has no
gradients (so the optimiser keeps no state for it) and runs under ``no_grad`` (no activations
kept). ``LinearProbeHead`` is DINOv2's linear head: BatchNorm and a 1×1 convolution over the
patch tokens of the last block ("linear") or of the last four concatenated ("+ms", evaluated
with multi-scale + flip test-time augmentation).
"""
from typing import Sequence

import torch
from mmseg.models.decode_heads.decode_head import BaseDecodeHead
from mmseg.models.segmentors import EncoderDecoder
from mmseg.models.utils import resize
from mmcv.cnn import build_norm_layer
from torch import nn

from ..models.layers.norm import LayerNorm2d
from ..registry import MODELS


@MODELS.register_module()
class FrozenBackboneSegmentor(EncoderDecoder):
    """An ``EncoderDecoder`` whose backbone is fixed: eval mode whatever the runner asks (no
    dropout, drop path or BatchNorm updates), no gradients, no activations kept. Its neck and
    heads train as usual."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.backbone.requires_grad_(False)
        self.backbone.eval()

    def train(self, mode: bool = True) -> 'FrozenBackboneSegmentor':
        super().train(mode)
        self.backbone.eval()
        return self

    def extract_feat(self, inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            features = self.backbone(inputs)
        return self.neck(features) if self.with_neck else features


@MODELS.register_module()
class LinearProbeHead(BaseDecodeHead):
    """DINOv2's linear segmentation head: the chosen blocks' patch-token maps, each token
    layer-normalised (the backbone's dense outputs are the blocks' raw tokens, where DINOv2
    reads them after the final norm), resized to the first map's grid and concatenated,
    then BatchNorm (``norm_cfg``) and the 1×1 classifier.

    Args:
        in_channels: channels of each chosen map.
        in_index: which of the backbone's outputs to read, one per entry of ``in_channels``.
    """

    def __init__(self, in_channels: Sequence[int], in_index: Sequence[int], **kwargs) -> None:
        if len(in_channels) != len(in_index):
            raise ValueError(f'LinearProbeHead reads one map per in_index: got in_channels '
                             f'{list(in_channels)} for in_index {list(in_index)}')
        super().__init__(in_channels=list(in_channels), channels=sum(in_channels),
                         in_index=list(in_index), input_transform='resize_concat', **kwargs)
        self.token_norms = nn.ModuleList(LayerNorm2d(width, eps=1e-6) for width in in_channels)
        self.bn = build_norm_layer(self.norm_cfg or dict(type='BN'), self.channels)[1]

    def forward(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        maps = [norm(inputs[index]) for norm, index in zip(self.token_norms, self.in_index)]
        grid = maps[0].shape[2:]
        features = torch.cat([resize(m, size=grid, mode='bilinear',
                                     align_corners=self.align_corners) for m in maps], dim=1)
        return self.cls_seg(self.bn(features))
