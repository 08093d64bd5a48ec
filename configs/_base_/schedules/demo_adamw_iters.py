# Short CPU schedule for the demo sets: AdamW (lr 1e-3, weight decay 0.05), 50-iteration
# linear warmup, then linear decay to zero; one evaluation at the end. Weight decay rule
# 'timm' (no decay on 1-D parameters and the backbone's no_weight_decay() names), as the
# demo results in docs/benchmarks.md were measured.
max_iters = 700
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=50),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=50, end=max_iters),
]
optim_wrapper = dict(
    type='OptimWrapper',
    constructor='vitdense.LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(weight_decay_rule='timm'),
    clip_grad=dict(max_norm=5.0))
