# ADE20k UperNet schedule of the XCiT paper (§4.3, after Swin): AdamW, lr 6e-5, weight decay
# 0.01 at batch 16, 160k iterations, 1500-iteration linear warmup then poly (power 1) decay.
# Weight decay rule 'custom_keys' as the official configs (semantic_segmentation/configs/
# xcit/*, custom_keys copied from Swin): only parameters whose name contains 'norm' (the
# backbone's LayerNorms) are exempt; everything else decays.
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
    paramwise_cfg=dict(weight_decay_rule='custom_keys',
                       custom_keys={'norm': dict(decay_mult=0.)},
                       layer_decay_rate=1.0))
default_hooks = dict(checkpoint=dict(type='vitdense.SafeCheckpointHook', max_keep_ckpts=3))
auto_scale_lr = dict(enable=False, base_batch_size=16)
