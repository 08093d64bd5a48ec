# Demo recipe: EoMT panoptic segmentation from scratch on the demo COCO panoptic set (3 thing
# and 2 stuff classes, 128×128): a small ViT (6 blocks, 128 wide, 8×8 patches), 20 queries in
# its last 2 blocks, masks at stride 4 (32×32) scored on 1,024 points; the demo schedule (700
# iterations), the masks of the two blocks annealed away over iterations 200-400 and 400-600
# (as the semantic and instance demos, ./demo_eomt_ade.py, ./demo_eomt_coco.py); family leaves
# swap the backbone.
_base_ = [
    './models/eomt-panoptic_columnar.py', './datasets/demo_coco_panoptic.py',
    './schedules/demo_adamw_iters.py', './default_runtime_mmdet.py'
]
num_things_classes, num_stuff_classes = 3, 2
num_classes = num_things_classes + num_stuff_classes
num_queries = 20
model = dict(
    backbone=dict(
        num_classes=num_classes, num_queries=num_queries, num_blocks=2,
        backbone=dict(arch=dict(embed_dims=128, num_layers=6, num_heads=4), patch_size=8,
                      img_size=128, init_cfg=None)),
    panoptic_head=dict(
        num_things_classes=num_things_classes, num_stuff_classes=num_stuff_classes,
        num_queries=num_queries, loss_cls=dict(class_weight=[1.0] * num_classes + [0.1])),
    panoptic_fusion_head=dict(num_things_classes=num_things_classes,
                              num_stuff_classes=num_stuff_classes),
    train_cfg=dict(num_points=1024),
    test_cfg=dict(max_per_image=20))
custom_hooks = [
    dict(type='vitdense.EoMTMaskAnnealingHook', start_iters=[200, 400], end_iters=[400, 600],
         power=0.9)
]
default_hooks = dict(
    logger=dict(interval=25, log_metric_by_epoch=False),
    checkpoint=dict(by_epoch=False, interval={{_base_.max_iters}}, max_keep_ckpts=1))
log_processor = dict(by_epoch=False)
