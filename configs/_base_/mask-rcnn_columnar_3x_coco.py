# Recipe: Mask R-CNN + FPN on a columnar backbone, COCO 3x (XCiT paper §4.2); family leaves
# set the backbone, its checkpoint and the neck's input widths.
_base_ = [
    './models/mask-rcnn_columnar-fpn.py', './datasets/coco_instance_detr-aug.py',
    './schedules/adamw_3x.py', './default_runtime_mmdet.py'
]
