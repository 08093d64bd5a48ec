# Recipe: Cascade Mask R-CNN in ViTDet's layout on a columnar backbone (ViTDet's headline
# detector), COCO at 1024² with large-scale jitter, ViTDet's 100-epoch schedule; family leaves
# set the backbone, its windows, checkpoint and the neck's input width.
_base_ = [
    './models/cascade-mask-rcnn_columnar-vitdet.py', './datasets/coco_instance_lsj-1024.py',
    './schedules/vitdet_adamw_100e.py', './default_runtime_mmdet.py'
]
default_hooks = dict(
    logger=dict(interval=50, log_metric_by_epoch=False),
    checkpoint=dict(by_epoch=False, interval=5000, max_keep_ckpts=3))
log_processor = dict(by_epoch=False)
