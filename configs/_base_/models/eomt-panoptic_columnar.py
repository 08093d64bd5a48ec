# EoMT (Kerssies et al. 2025) for panoptic segmentation in mmdet: the instance model
# (./eomt-instance_columnar.py: mmdet's Mask2Former detector around vitdense.EoMT, the losses
# and matcher in vitdense.EoMTDetHead) with stuff classes, and mmdet's MaskFormerFusionHead
# making the panoptic result from the last prediction. The official COCO panoptic settings
# (configs/dinov2/coco/panoptic/eomt_large_640.yaml and MaskClassificationPanoptic's defaults):
# 200 queries in the last 4 blocks, 80 thing and 53 stuff classes, the same losses and matcher;
# a query kept above 0.8 class score (`object_mask_thr`, the official mask_thresh), a segment
# kept if at least 0.8 of its mask survives the overlap (`iou_thr`, the official
# overlap_thresh). Leaves set the backbone, the classes and the input size.
_base_ = './eomt-instance_columnar.py'
num_things_classes = 80
num_stuff_classes = 53
num_classes = num_things_classes + num_stuff_classes
model = dict(
    data_preprocessor=dict(pad_seg=True, seg_pad_value=255),
    backbone=dict(num_classes=num_classes),
    panoptic_head=dict(num_things_classes=num_things_classes,
                       num_stuff_classes=num_stuff_classes,
                       loss_cls=dict(class_weight=[1.0] * num_classes + [0.1])),
    panoptic_fusion_head=dict(num_things_classes=num_things_classes,
                              num_stuff_classes=num_stuff_classes),
    test_cfg=dict(panoptic_on=True, semantic_on=False, instance_on=False,
                  object_mask_thr=0.8, iou_thr=0.8))
