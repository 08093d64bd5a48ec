# Cascade Mask R-CNN in ViTDet's layout (Li et al., 2022, §4, Table 3; detectron2
# projects/ViTDet/configs/COCO/cascade_mask_rcnn_vitdet_b_100ep.py): the backbone, simple
# feature pyramid, two-conv RPN and LayerNorm mask convs of ./mask-rcnn_columnar-vitdet.py,
# with three cascade stages (IoU 0.5, 0.6, 0.7), each a box head of four 3×3 convs with
# LayerNorm and one 1024-wide fc, class-agnostic boxes. mmdet's cascade keeps its stage loss
# weights (1, 0.5, 0.25) and a mask head per stage where detectron2 scales each stage's
# gradient into the features by 1/3 and masks the last stage only.
_base_ = './mask-rcnn_columnar-vitdet.py'
box_head_4conv1fc = dict(
    type='Shared4Conv1FCBBoxHead', in_channels=256, conv_out_channels=256, fc_out_channels=1024,
    roi_feat_size=7, num_classes=80, norm_cfg={{_base_.head_norm_cfg}}, reg_class_agnostic=True,
    loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
    loss_bbox=dict(type='SmoothL1Loss', beta=1.0, loss_weight=1.0))
# detectron2's box-regression weights (10, 10, 5, 5), (20, 20, 10, 10), (30, 30, 15, 15)
stage_target_stds = ([0.1, 0.1, 0.2, 0.2], [0.05, 0.05, 0.1, 0.1],
                     [0.033, 0.033, 0.067, 0.067])
model = dict(
    type='CascadeRCNN',
    roi_head=dict(
        _delete_=True, type='CascadeRoIHead', num_stages=3, stage_loss_weights=[1, 0.5, 0.25],
        bbox_roi_extractor=dict(
            type='SingleRoIExtractor', out_channels=256, featmap_strides=[4, 8, 16, 32],
            roi_layer=dict(type='RoIAlign', output_size=7, sampling_ratio=0)),
        bbox_head=[dict(box_head_4conv1fc, bbox_coder=dict(
            type='DeltaXYWHBBoxCoder', target_means=[0.0] * 4, target_stds=stds))
            for stds in stage_target_stds],
        mask_roi_extractor=dict(
            type='SingleRoIExtractor', out_channels=256, featmap_strides=[4, 8, 16, 32],
            roi_layer=dict(type='RoIAlign', output_size=14, sampling_ratio=0)),
        mask_head=dict(
            type='FCNMaskHead', num_convs=4, in_channels=256, conv_out_channels=256,
            num_classes=80, norm_cfg={{_base_.head_norm_cfg}},
            loss_mask=dict(type='CrossEntropyLoss', use_mask=True, loss_weight=1.0))),
    train_cfg=dict(rcnn=[
        dict(assigner=dict(type='MaxIoUAssigner', pos_iou_thr=iou, neg_iou_thr=iou,
                           min_pos_iou=iou, match_low_quality=False, ignore_iof_thr=-1),
             sampler=dict(type='RandomSampler', num=512, pos_fraction=0.25, neg_pos_ub=-1,
                          add_gt_as_proposals=True),
             mask_size=28, pos_weight=-1, debug=False)
        for iou in (0.5, 0.6, 0.7)]))
