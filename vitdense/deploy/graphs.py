"""Tensor-in / tensor-out forms of our models for ``torch.export`` and ONNX.

mmseg and mmdet run inference through data samples, Python lists and branches on how many
boxes survive; an exported graph takes tensors and returns tensors. These modules run the
same layers in the same order on one image tensor, with every branch on a data-dependent
size replaced by a tensor operation that gives the same result:

- :class:`SegmentorGraph`: an mmseg encoder-decoder (UperNet, Semantic FPN) in whole-image
  or sliding-window mode: the image as loaded (B, 3, H, W, 0-255, the loader's channel order)
  in, the logits resized to the image and the per-pixel labels out;
- :class:`MaskRCNNGraph`: an mmdet two-stage detector with a mask head, one image in, the
  boxes, scores, labels and binary masks (at the image size) out, with RPN proposals,
  class-wise NMS and RoIAlign on torchvision's kernels, which have standard ONNX operators
  (``NonMaxSuppression``, ``RoiAlign``).

A backbone needs no wrapper: it maps a normalised image to its feature pyramid already.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision.ops import nms, roi_align

from ..model_factory import image_normalization


class Normalize(nn.Module):
    """The data preprocessor's image step in the graph: channel flip (``bgr_to_rgb``),
    then ``(x - mean) / std``, as mmengine's ``ImgDataPreprocessor`` (mmdet) and mmseg's
    ``SegDataPreProcessor`` do it."""

    def __init__(self, preprocessor: nn.Module) -> None:
        super().__init__()
        self.flip = bool(getattr(preprocessor, '_channel_conversion', False) or
                         getattr(preprocessor, 'channel_conversion', False))
        mean_std = image_normalization(preprocessor)
        self.register_buffer('mean', None if mean_std is None else mean_std[0].clone())
        self.register_buffer('std', None if mean_std is None else mean_std[1].clone())

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        if self.flip:
            image = image.flip(1)
        image = image.float()
        if self.mean is not None:
            image = (image - self.mean) / self.std
        return image


def _bin_means(bins: int, size: int, like: torch.Tensor) -> torch.Tensor:
    """(bins, size) matrix averaging adaptive-pooling bin i: positions floor(i·size/bins)
    to ceil((i+1)·size/bins) - 1, the bins of ``F.adaptive_avg_pool2d``."""
    index = torch.arange(bins, device=like.device)
    start = index * size // bins
    end = ((index + 1) * size + bins - 1) // bins
    position = torch.arange(size, device=like.device)
    member = ((position >= start[:, None]) & (position < end[:, None])).to(like.dtype)
    return member / member.sum(dim=1, keepdim=True)


class AdaptiveAvgPool2d(nn.Module):
    """``nn.AdaptiveAvgPool2d`` as two averaging matrices, so that an exported graph pools
    inputs of any size: torch's decomposition indexes the input with the bins of the size
    it was traced at (wrong elsewhere). Equal up to float rounding."""

    def __init__(self, output_size: int | tuple) -> None:
        super().__init__()
        size = (output_size, output_size) if isinstance(output_size, int) else output_size
        self.output_size = tuple(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_h, out_w = (o if o is not None else s for o, s in zip(self.output_size,
                                                                  x.shape[-2:]))
        rows = _bin_means(out_h, x.shape[-2], x)
        cols = _bin_means(out_w, x.shape[-1], x)
        return rows @ x @ cols.t()


class IntegerUpsample(nn.Module):
    """mmseg's ``Upsample`` by a whole factor: the output size as ``size * factor`` in
    integers, where mmseg's ``int(size * float(factor))`` would fix the traced size into the
    graph. The same sizes, hence the same interpolation."""

    def __init__(self, factor: int, mode: str, align_corners: bool | None) -> None:
        super().__init__()
        self.factor, self.mode, self.align_corners = factor, mode, align_corners

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = (x.shape[-2] * self.factor, x.shape[-1] * self.factor)
        return F.interpolate(x, size, mode=self.mode, align_corners=self.align_corners)


def _exportable(module: nn.Module) -> nn.Module | None:
    """The export-friendly stand-in of a layer that would fix the traced size, or None."""
    if isinstance(module, nn.AdaptiveAvgPool2d):
        return AdaptiveAvgPool2d(module.output_size)
    factor = getattr(module, 'scale_factor', None)
    if (type(module).__name__ == 'Upsample' and not getattr(module, 'size', None)
            and isinstance(factor, float) and factor.is_integer()):
        return IntegerUpsample(int(factor), module.mode, module.align_corners)
    return None


class SegmentorGraph(nn.Module):
    """An mmseg ``EncoderDecoder`` as its ``test_cfg.mode`` runs it: ``(logits, labels)``,
    the logits bilinearly resized to the input as ``decode_head.predict`` does. Whole images
    of any size; or sliding windows (``mode='slide'``), as mmseg's ``slide_inference``
    places and averages them: the windows follow from the image size, so such a graph holds
    the windows of the size it was exported at (exporting with dynamic sizes is refused).

    Works on a copy of the segmentor whose layers that would fix the traced size into the
    graph are replaced: ``nn.AdaptiveAvgPool2d`` (UperNet's pyramid pooling) by
    :class:`AdaptiveAvgPool2d`, mmseg's ``Upsample`` (Semantic FPN's head) by
    :class:`IntegerUpsample`."""

    def __init__(self, segmentor: nn.Module) -> None:
        super().__init__()
        test_cfg = segmentor.test_cfg or {}
        self.mode = test_cfg.get('mode', 'whole')
        if self.mode not in ('whole', 'slide'):
            raise ValueError(f"test_cfg.mode {self.mode!r}: the exported segmentor runs "
                             f"'whole' images or 'slide' windows")
        if self.mode == 'slide':
            self.crop_size, self.stride = tuple(test_cfg['crop_size']), tuple(test_cfg['stride'])
        self.normalize = Normalize(segmentor.data_preprocessor)
        self.segmentor = copy.deepcopy(segmentor)
        swaps = [(name, _exportable(module)) for name, module in self.segmentor.named_modules()]
        for name, stand_in in swaps:
            if stand_in is not None:
                parent, _, child = name.rpartition('.')
                setattr(self.segmentor.get_submodule(parent), child, stand_in)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = self.normalize(image)
        logits = self._slide(inputs) if self.mode == 'slide' else self._whole(inputs)
        return logits, logits.argmax(dim=1)

    def _whole(self, inputs: torch.Tensor) -> torch.Tensor:
        logits = self.segmentor.decode_head.forward(self.segmentor.extract_feat(inputs))
        return F.interpolate(logits, size=inputs.shape[2:], mode='bilinear',
                             align_corners=self.segmentor.decode_head.align_corners)

    def _slide(self, inputs: torch.Tensor) -> torch.Tensor:
        """Windows of ``crop_size`` every ``stride`` (the last flush with the far edge), each
        segmented whole, their logits summed in place and divided by the windows covering
        each pixel."""
        height, width = inputs.shape[2:]
        if not (isinstance(height, int) and isinstance(width, int)):
            raise ValueError("sliding windows follow from the image size: export a "
                             "test_cfg.mode='slide' segmentor at a fixed size (no dynamic "
                             "height / width)")
        logits, count = 0, torch.zeros(1, 1, height, width)
        for top, left in _window_corners((height, width), self.crop_size, self.stride):
            bottom, right = (min(top + self.crop_size[0], height),
                             min(left + self.crop_size[1], width))
            window = self._whole(inputs[:, :, top:bottom, left:right])
            logits = logits + F.pad(window, (left, width - right, top, height - bottom))
            count[:, :, top:bottom, left:right] += 1
        return logits / count.to(inputs)


def _window_corners(size: tuple[int, int], crop: tuple[int, int],
                    stride: tuple[int, int]) -> list[tuple[int, int]]:
    """Top-left corners of mmseg's sliding windows over an image of ``size``."""
    rows, cols = (max(s - c + t - 1, 0) // t + 1 for s, c, t in zip(size, crop, stride))
    return [(max(min(r * stride[0] + crop[0], size[0]) - crop[0], 0),
             max(min(c * stride[1] + crop[1], size[1]) - crop[1], 0))
            for r in range(rows) for c in range(cols)]


def _pad_to_multiple(image: torch.Tensor, divisor: int) -> torch.Tensor:
    """Zero-pad the bottom / right to a multiple of ``divisor`` (mmdet's ``stack_batch``)."""
    pad_h, pad_w = ((divisor - size % divisor) % divisor for size in image.shape[2:])
    return F.pad(image, (0, pad_w, 0, pad_h))


def _batched_nms(boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor,
                 iou_threshold: float) -> torch.Tensor:
    """NMS within each group (mmcv's ``batched_nms``: boxes of different groups moved apart
    by ``group * (max coordinate + 1)``), kept indices by descending score. Boxes lie in
    the image (coordinates >= 0), so a 0 joins the maximum to make it defined with no box."""
    offsets = groups.to(boxes) * (torch.cat([boxes.flatten(), boxes.new_zeros(1)]).max() + 1)
    return nms(boxes + offsets[:, None], scores, iou_threshold)


class MaskRCNNGraph(nn.Module):
    """An mmdet Mask R-CNN on one image: ``(boxes (N, 4), scores (N,), labels (N,),
    masks (N, H, W) bool)``, boxes in the pixels of the input image.

    The steps and settings are mmdet's ``predict`` with ``rescale=False``: RPN (top
    ``nms_pre`` anchors per level, boxes of zero size dropped, NMS per level, the best
    ``max_per_img``), the box head (class-wise NMS of the boxes scoring over
    ``score_thr``), the mask head, the masks pasted within one pixel of their box and
    thresholded. RoI features are pooled on every level and each RoI keeps its own level's,
    which equals pooling each level's RoIs alone.
    """

    def __init__(self, detector: nn.Module) -> None:
        super().__init__()
        for part in ('rpn_head', 'roi_head'):
            if not hasattr(detector, part):
                raise ValueError(f'{type(detector).__name__} is no two-stage detector '
                                 f'(no {part}); the exported detector is Mask R-CNN')
        if not getattr(detector.roi_head, 'with_mask', False):
            raise ValueError(f'{type(detector).__name__} has no mask head; the exported '
                             f'detector is Mask R-CNN')
        self.detector = detector
        self.normalize = Normalize(detector.data_preprocessor)
        self.pad_divisor = detector.data_preprocessor.pad_size_divisor
        self.rpn_cfg = detector.test_cfg.rpn
        self.rcnn_cfg = detector.test_cfg.rcnn

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if image.shape[0] != 1:
            raise ValueError(f'the exported Mask R-CNN takes one image, got a batch of '
                             f'{image.shape[0]}')
        image_hw = (image.shape[2], image.shape[3])
        features = self.detector.extract_feat(
            _pad_to_multiple(self.normalize(image), self.pad_divisor))
        proposals = self.proposals(features, image_hw)
        boxes, scores, labels = self.detections(features, proposals, image_hw)
        return boxes, scores, labels, self.masks(features, boxes, labels, image_hw)

    def proposals(self, features: tuple[torch.Tensor, ...], image_hw: tuple) -> torch.Tensor:
        """RPN boxes (K, 4), best first (``RPNHead._predict_by_feat_single``)."""
        head, cfg = self.detector.rpn_head, self.rpn_cfg
        cls_scores, deltas = head(features)
        anchors = head.prior_generator.grid_priors([s.shape[-2:] for s in cls_scores],
                                                   device=cls_scores[0].device)
        scores, boxes, levels = [], [], []
        for level, (score, delta, prior) in enumerate(zip(cls_scores, deltas, anchors)):
            score = score[0].permute(1, 2, 0).reshape(-1).sigmoid()
            delta = delta[0].permute(1, 2, 0).reshape(-1, head.bbox_coder.encode_size)
            score, order = score.sort(descending=True)
            # the best nms_pre, or all: no branch on which is fewer at the traced size
            count = torch.sym_min(cfg.nms_pre, score.shape[0])
            order = order[:count]
            scores.append(score[:count])
            boxes.append(head.bbox_coder.decode(prior[order], delta[order],
                                                max_shape=image_hw))
            levels.append(torch.full_like(order, level))
        scores, boxes, levels = torch.cat(scores), torch.cat(boxes), torch.cat(levels)
        if cfg.get('min_bbox_size', -1) >= 0:
            sizes = boxes[:, 2:] - boxes[:, :2]
            valid = (sizes > cfg.min_bbox_size).all(dim=1)
            scores, boxes, levels = scores[valid], boxes[valid], levels[valid]
        keep = _batched_nms(boxes, scores, levels, cfg.nms.iou_threshold)
        return boxes[keep[:cfg.max_per_img]]

    def roi_features(self, extractor: nn.Module, features: tuple[torch.Tensor, ...],
                     boxes: torch.Tensor) -> torch.Tensor:
        """``SingleRoIExtractor`` without its branch on empty levels: every level pools
        every RoI and each RoI keeps the level ``map_roi_levels`` assigns it."""
        rois = torch.cat([boxes.new_zeros(boxes.shape[0], 1), boxes], dim=1)
        num_levels = len(extractor.featmap_strides)
        levels = extractor.map_roi_levels(rois, num_levels)[:, None, None, None]
        pooled = None
        for level, layer in enumerate(extractor.roi_layers[:num_levels]):
            if getattr(layer, 'pool_mode', 'avg') != 'avg':
                raise ValueError(f'RoIAlign pool_mode {layer.pool_mode!r}: only avg has an '
                                 f'ONNX form (RoiAlign)')
            out = roi_align(features[level], rois, layer.output_size, layer.spatial_scale,
                            layer.sampling_ratio, layer.aligned)
            pooled = out if pooled is None else torch.where(levels == level, out, pooled)
        return pooled

    def detections(self, features: tuple[torch.Tensor, ...], proposals: torch.Tensor,
                   image_hw: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Box head and ``multiclass_nms``: boxes, scores and labels, best first."""
        roi_head, cfg = self.detector.roi_head, self.rcnn_cfg
        head = roi_head.bbox_head
        if head.reg_class_agnostic or head.custom_cls_channels:
            raise ValueError('the exported Mask R-CNN needs a class-wise box head with a '
                             'softmax classifier (mmdet Shared2FCBBoxHead)')
        cls_score, delta = head(self.roi_features(roi_head.bbox_roi_extractor, features,
                                                  proposals))
        num_classes = head.num_classes
        scores = F.softmax(cls_score, dim=-1)[:, :num_classes].reshape(-1)
        boxes = head.bbox_coder.decode(proposals.repeat_interleave(num_classes, dim=0),
                                       delta.view(-1, head.bbox_coder.encode_size),
                                       max_shape=image_hw)
        labels = torch.arange(num_classes, device=boxes.device).repeat(proposals.shape[0])
        valid = scores > cfg.score_thr
        boxes, scores, labels = boxes[valid], scores[valid], labels[valid]
        keep = _batched_nms(boxes, scores, labels, cfg.nms.iou_threshold)[:cfg.max_per_img]
        return boxes[keep], scores[keep], labels[keep]

    def masks(self, features: tuple[torch.Tensor, ...], boxes: torch.Tensor,
              labels: torch.Tensor, image_hw: tuple) -> torch.Tensor:
        """Mask head, each box's class channel, pasted into the image (``FCNMaskHead``)."""
        roi_head = self.detector.roi_head
        logits = roi_head.mask_head(self.roi_features(roi_head.mask_roi_extractor, features,
                                                      boxes))
        if not roi_head.mask_head.class_agnostic:
            logits = logits.gather(1, labels[:, None, None, None].expand(
                -1, 1, *logits.shape[2:]))
        return paste_masks(logits.sigmoid(), boxes, image_hw) >= self.rcnn_cfg.mask_thr_binary


def paste_masks(masks: torch.Tensor, boxes: torch.Tensor, image_hw: tuple) -> torch.Tensor:
    """(N, 1, h, w) box-relative mask probabilities sampled at the pixel centres of an
    image (N, H, W), as mmdet's ``_do_paste_mask``; pixels more than one pixel outside the
    box stay 0, as mmdet pastes (on the CPU) only that region."""
    height, width = image_hw
    x0, y0, x1, y1 = boxes.split(1, dim=1)
    ys = torch.arange(height, device=boxes.device, dtype=torch.float32)
    xs = torch.arange(width, device=boxes.device, dtype=torch.float32)
    grid_y = ((ys + 0.5) - y0) / (y1 - y0) * 2 - 1
    grid_x = ((xs + 0.5) - x0) / (x1 - x0) * 2 - 1
    grid_y = torch.where(torch.isinf(grid_y), 0., grid_y)
    grid_x = torch.where(torch.isinf(grid_x), 0., grid_x)
    num = masks.shape[0]
    grid = torch.stack([grid_x[:, None, :].expand(num, height, width),
                        grid_y[:, :, None].expand(num, height, width)], dim=3)
    pasted = F.grid_sample(masks.float(), grid, align_corners=False)[:, 0]
    inside_y = (ys >= (y0.floor() - 1).clamp(min=0)) & (ys < (y1.ceil() + 1))
    inside_x = (xs >= (x0.floor() - 1).clamp(min=0)) & (xs < (x1.ceil() + 1))
    return pasted * (inside_y[:, :, None] & inside_x[:, None, :])
