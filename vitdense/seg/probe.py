"""Frozen-backbone probes of dense features (DINOv2, Oquab et al. 2023, §7.3).

``FrozenBackboneSegmentor`` trains its heads only: the backbone stays in eval mode, has no
gradients (so the optimiser keeps no state for it) and runs under ``no_grad`` (no activations
kept). ``LinearProbeHead`` is DINOv2's linear head: BatchNorm and a 1×1 convolution over the
patch tokens of the last block ("linear") or of the last four concatenated ("+ms", evaluated
with multi-scale + flip test-time augmentation), each optionally concatenated with its block's
class token.
"""
from typing import Sequence, Union

import torch
from mmseg.models.decode_heads.decode_head import BaseDecodeHead
from mmseg.models.segmentors import EncoderDecoder
from mmseg.models.utils import resize
from mmcv.cnn import build_norm_layer
from torch import nn

from ..models.layers.norm import LayerNorm2d
from ..registry import MODELS

#: one backbone output: a map (B, C, H, W), or a (map, class token (B, C)) pair
InputMap = Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]


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
        use_cls_token: concatenate each map with its block's class token, normalised as its
            patch tokens and broadcast over the grid (DINOv2's head with the class token:
            twice the channels). The backbone hands out (map, class token) pairs
            (``output_cls_token=True``).
    """

    def __init__(self, in_channels: Sequence[int], in_index: Sequence[int],
                 use_cls_token: bool = False, **kwargs) -> None:
        if len(in_channels) != len(in_index):
            raise ValueError(f'LinearProbeHead reads one map per in_index: got in_channels '
                             f'{list(in_channels)} for in_index {list(in_index)}')
        channels = sum(in_channels) * (2 if use_cls_token else 1)
        super().__init__(in_channels=list(in_channels), channels=channels,
                         in_index=list(in_index), input_transform='resize_concat', **kwargs)
        self.use_cls_token = use_cls_token
        self.token_norms = nn.ModuleList(LayerNorm2d(width, eps=1e-6) for width in in_channels)
        self.bn = build_norm_layer(self.norm_cfg or dict(type='BN'), self.channels)[1]

    def forward(self, inputs: Sequence[InputMap]) -> torch.Tensor:
        maps = [self._normalised(norm, inputs[index])
                for norm, index in zip(self.token_norms, self.in_index)]
        grid = maps[0].shape[2:]
        features = torch.cat([resize(m, size=grid, mode='bilinear',
                                     align_corners=self.align_corners) for m in maps], dim=1)
        return self.cls_seg(self.bn(features))

    def _normalised(self, norm: nn.Module, output: InputMap) -> torch.Tensor:
        """One backbone output's map, layer-normalised token by token, with its class
        token (normalised alike, broadcast over the grid) concatenated where the head uses
        it."""
        pair = not isinstance(output, torch.Tensor)
        if pair != self.use_cls_token:
            raise ValueError(
                'LinearProbeHead(use_cls_token=True) reads (map, class token) pairs: build the '
                'backbone with output_cls_token=True' if self.use_cls_token else
                'the backbone hands out (map, class token) pairs (output_cls_token=True): set '
                'LinearProbeHead(use_cls_token=True) to use the class token, or drop the option')
        if not pair:
            return norm(output)
        feature_map, cls_token = output
        cls_map = norm(cls_token[:, :, None, None]).expand_as(feature_map)
        return torch.cat([norm(feature_map), cls_map], dim=1)
