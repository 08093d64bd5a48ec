# EoMT (Kerssies et al. 2025) for semantic segmentation in mmseg: the queries and mask module
# ride on the backbone (vitdense.EoMT), and the head holds mmseg's Mask2Former losses, matcher
# and inference (vitdense.EoMTHead). The official ADE20k settings (configs/dinov2/ade20k/
# semantic/eomt_large_512.yaml and MaskClassificationSemantic's defaults): 100 queries in the
# last 4 blocks; class 2.0 ("no object" 0.1), mask BCE 5.0 and dice 5.0, on 12,544 points
# (oversampling 3, importance 0.75), the same weights in the Hungarian matcher. Leaves set
# the backbone, the classes and the input size, and import vitdense.seg (custom_imports).
num_classes = 150
num_queries = 100
model = dict(
    type='EncoderDecoder',
    data_preprocessor=dict(
        type='SegDataPreProcessor', mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True, pad_val=0, seg_pad_val=255, size=(512, 512)),
    backbone=dict(
        type='vitdense.EoMT', num_classes=num_classes, num_queries=num_queries, num_blocks=4,
        # the final norm, which the mask module reads through, is built for out_type='cls_token'
        backbone=dict(type='vitdense.ViT', out_type='cls_token')),
    decode_head=dict(
        type='vitdense.EoMTHead', num_classes=num_classes, num_queries=num_queries,
        align_corners=False,
        loss_cls=dict(type='mmdet.CrossEntropyLoss', use_sigmoid=False, loss_weight=2.0,
                      reduction='mean', class_weight=[1.0] * num_classes + [0.1]),
        loss_mask=dict(type='mmdet.CrossEntropyLoss', use_sigmoid=True, reduction='mean',
                       loss_weight=5.0),
        loss_dice=dict(type='mmdet.DiceLoss', use_sigmoid=True, activate=True,
                       reduction='mean', naive_dice=True, eps=1.0, loss_weight=5.0),
        train_cfg=dict(
            num_points=12544, oversample_ratio=3.0, importance_sample_ratio=0.75,
            assigner=dict(
                type='mmdet.HungarianAssigner',
                match_costs=[
                    dict(type='mmdet.ClassificationCost', weight=2.0),
                    dict(type='mmdet.CrossEntropyLossCost', weight=5.0, use_sigmoid=True),
                    dict(type='mmdet.DiceCost', weight=5.0, pred_act=True, eps=1.0)]),
            sampler=dict(type='mmdet.MaskPseudoSampler'))),
    train_cfg=dict(),
    test_cfg=dict(mode='whole'))
