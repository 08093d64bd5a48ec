# EoMT (Kerssies et al. 2025) for instance segmentation in mmdet: mmdet's Mask2Former
# detector whose backbone is vitdense.EoMT (the queries and mask module ride on the ViT) and
# whose head holds mmdet's Mask2Former losses and matcher (vitdense.EoMTDetHead); mmdet's
# MaskFormerFusionHead turns the last prediction into instances. The official COCO instance
# settings (configs/dinov2/coco/instance/eomt_large_640.yaml and MaskClassificationInstance's
# defaults): 200 queries in the last 4 blocks; losses and matcher as for ADE20k semantic
# (./eomt_columnar.py). Leaves set the backbone, the classes and the input size.
num_things_classes = 80
num_stuff_classes = 0
num_classes = num_things_classes + num_stuff_classes
num_queries = 200
model = dict(
    type='Mask2Former',
    data_preprocessor=dict(
        type='DetDataPreprocessor', mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375], bgr_to_rgb=True, pad_size_divisor=32, pad_mask=True,
        mask_pad_value=0, pad_seg=False),
    backbone=dict(
        type='vitdense.EoMT', num_classes=num_classes, num_queries=num_queries, num_blocks=4,
        # the final norm, which the mask module reads through, is built for out_type='cls_token'
        backbone=dict(type='vitdense.ViT', out_type='cls_token')),
    panoptic_head=dict(
        type='vitdense.EoMTDetHead', num_things_classes=num_things_classes,
        num_stuff_classes=num_stuff_classes, num_queries=num_queries,
        loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=2.0,
                      reduction='mean', class_weight=[1.0] * num_classes + [0.1]),
        loss_mask=dict(type='CrossEntropyLoss', use_sigmoid=True, reduction='mean',
                       loss_weight=5.0),
        loss_dice=dict(type='DiceLoss', use_sigmoid=True, activate=True, reduction='mean',
                       naive_dice=True, eps=1.0, loss_weight=5.0)),
    panoptic_fusion_head=dict(
        type='MaskFormerFusionHead', num_things_classes=num_things_classes,
        num_stuff_classes=num_stuff_classes, loss_panoptic=None, init_cfg=None),
    train_cfg=dict(
        num_points=12544, oversample_ratio=3.0, importance_sample_ratio=0.75,
        assigner=dict(
            type='HungarianAssigner',
            match_costs=[
                dict(type='ClassificationCost', weight=2.0),
                dict(type='CrossEntropyLossCost', weight=5.0, use_sigmoid=True),
                dict(type='DiceCost', weight=5.0, pred_act=True, eps=1.0)]),
        sampler=dict(type='MaskPseudoSampler')),
    test_cfg=dict(panoptic_on=False, semantic_on=False, instance_on=True, max_per_image=100,
                  iou_thr=0.8, filter_low_score=True))
