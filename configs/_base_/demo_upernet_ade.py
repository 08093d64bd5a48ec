# Demo recipe: UperNet (narrow heads, small XCiT) from scratch on the demo ADE20k-layout set,
# logged and checkpointed by iteration; family leaves swap the backbone.
_base_ = [
    './models/upernet_columnar_demo.py', './datasets/demo_ade.py',
    './schedules/demo_adamw_iters.py', './default_runtime_mmseg.py'
]
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=25, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='vitdense.SafeCheckpointHook', by_epoch=False, interval={{_base_.max_iters}},
                    max_keep_ckpts=1),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'))
