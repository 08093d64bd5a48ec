# Demo recipe: EoMT from scratch on the demo ADE20k-layout set (5 classes, 128×128): a small
# ViT (6 blocks, 128 wide, 8×8 patches), 20 queries in its last 2 blocks, masks at stride 4
# (32×32) scored on 1,024 points; the demo schedule (700 iterations), the masks of the two
# blocks annealed away over iterations 200-400 and 400-600 (the official schedule's shape:
# block by block, one after another, poly 0.9, done before training ends); family leaves
# swap the backbone.
_base_ = [
    './models/eomt_columnar.py', './datasets/demo_ade.py', './schedules/demo_adamw_iters.py',
    './default_runtime_mmseg.py'
]
custom_imports = dict(imports=['vitdense', 'vitdense.seg'], allow_failed_imports=False)
num_classes = 5
num_queries = 20
model = dict(
    data_preprocessor=dict(size=(128, 128)),
    backbone=dict(
        num_classes=num_classes, num_queries=num_queries, num_blocks=2,
        backbone=dict(arch=dict(embed_dims=128, num_layers=6, num_heads=4), patch_size=8,
                      img_size=128, init_cfg=None)),
    decode_head=dict(
        num_classes=num_classes, num_queries=num_queries,
        loss_cls=dict(class_weight=[1.0] * num_classes + [0.1]),
        train_cfg=dict(num_points=1024)))
custom_hooks = [
    dict(type='vitdense.EoMTMaskAnnealingHook', start_iters=[200, 400], end_iters=[400, 600],
         power=0.9)
]
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=25, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='vitdense.SafeCheckpointHook', by_epoch=False,
                    interval={{_base_.max_iters}}, max_keep_ckpts=1),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'))
