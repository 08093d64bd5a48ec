# Demo recipe: Mask R-CNN (narrow heads, small XCiT) from scratch on the demo COCO set,
# logged and checkpointed by iteration; family leaves swap the backbone.
_base_ = [
    './models/mask-rcnn_columnar-fpn_demo.py', './datasets/demo_coco.py',
    './schedules/demo_adamw_iters.py', './default_runtime_mmdet.py'
]
default_hooks = dict(
    logger=dict(interval=25, log_metric_by_epoch=False),
    checkpoint=dict(by_epoch=False, interval={{_base_.max_iters}}, max_keep_ckpts=1))
log_processor = dict(by_epoch=False)
