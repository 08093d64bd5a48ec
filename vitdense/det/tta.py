"""Multi-scale + flip test-time augmentation for detectors that predict masks.

mmdet's ``DetTTAModel`` merges the views' boxes (flipped back, pooled, class-wise NMS) but
refuses instance masks. ``InstanceTTAModel`` merges boxes the same way and lets every kept
detection bring the mask its view predicted, flipped back to the original image: the
detection-level merging of the papers' multi-scale Mask R-CNN results.
"""
import torch
from mmcv.ops import batched_nms
from mmdet.models.test_time_augs import DetTTAModel
from mmdet.structures import DetDataSample
from mmengine.structures import InstanceData

from ..registry import MODELS

#: the image axes a flip direction mirrors, for masks of shape (N, H, W)
FLIP_AXES = {'horizontal': (-1,), 'vertical': (-2,), 'diagonal': (-2, -1)}


def unflip_masks(masks: torch.Tensor, metainfo: dict) -> torch.Tensor:
    """A view's masks (N, H, W) in the original image's orientation."""
    if not metainfo.get('flip', False):
        return masks
    direction = metainfo['flip_direction']
    if direction not in FLIP_AXES:
        raise ValueError(f'flip_direction {direction!r}: expected one of {list(FLIP_AXES)}')
    return masks.flip(FLIP_AXES[direction])


@MODELS.register_module()
class InstanceTTAModel(DetTTAModel):
    """``DetTTAModel`` whose merged detections keep their masks.

    Boxes of every view are flipped back and pooled, then class-wise NMS
    (``tta_cfg.nms``) keeps at most ``tta_cfg.max_per_img``; each survivor's mask is the one
    its own view predicted (views are rescaled to the original image by the detector, so
    their masks share one size). Views without masks merge as ``DetTTAModel`` does.
    """

    def _merge_single_sample(self, data_samples: list[DetDataSample]) -> DetDataSample:
        if data_samples[0].pred_instances.get('masks', None) is None:
            return super()._merge_single_sample(data_samples)
        metas = [sample.metainfo for sample in data_samples]
        predictions = [sample.pred_instances for sample in data_samples]
        boxes, scores = self.merge_aug_bboxes([p.bboxes for p in predictions],
                                              [p.scores for p in predictions], metas)
        labels = torch.cat([p.labels for p in predictions])
        masks = torch.cat([unflip_masks(p.masks, meta)
                           for p, meta in zip(predictions, metas)])
        merged = data_samples[0]
        if boxes.numel() == 0:
            merged.pred_instances = InstanceData(bboxes=boxes, scores=scores, labels=labels,
                                                 masks=masks)
            return merged
        kept, keep = batched_nms(boxes, scores, labels, self.tta_cfg['nms'])
        limit = self.tta_cfg['max_per_img']
        kept, keep = kept[:limit], keep[:limit]
        merged.pred_instances = InstanceData(bboxes=kept[:, :-1], scores=kept[:, -1],
                                             labels=labels[keep], masks=masks[keep])
        return merged
