# Mask R-CNN + FPN, COCO 3x, XCiT-S12/16 (the _base_ model, XCiT paper Tables 5-6).
_base_ = [
    '../_base_/models/mask-rcnn_columnar-fpn.py',
    '../_base_/datasets/coco_instance_detr-aug.py',
    '../_base_/schedules/adamw_3x.py', '../_base_/default_runtime_mmdet.py'
]
