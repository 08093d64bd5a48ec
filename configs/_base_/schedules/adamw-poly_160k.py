# ADE20k UperNet schedule of the XCiT paper (§4.3, after Swin): AdamW, lr 6e-5, weight decay
# 0.01 at batch 16, 160k iterations, 1500-iteration linear warmup then poly (power 1) decay.
# No weight decay on norms, biases, position embeddings, LayerScale and temperatures.
_base_ = 'mmseg::_base_/schedules/schedule_160k.py'
max_iters = 160000
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=1500, end=max_iters),
]
optim_wrapper = dict(
    constructor='vitdense.LayerDecayOptimWrapperConstructor',
    optimizer=dict(_delete_=True, type='AdamW', lr=6e-5, betas=(0.9, 0.999),
                   weight_decay=0.01),
    paramwise_cfg=dict(layer_decay_rate=1.0))
default_hooks = dict(checkpoint=dict(max_keep_ckpts=3))
auto_scale_lr = dict(enable=False, base_batch_size=16)
