# Mask R-CNN 3x schedule of the XCiT paper (§4.2): AdamW, lr 1e-4, weight decay 0.05 at
# batch 16, 36 epochs, lr /10 after epochs 27 and 33, 500-iteration linear warmup.
# Weight decay rule 'custom_keys' as the official config (detection/configs/xcit/
# mask_rcnn_xcit_*_3x_coco.py, custom_keys copied from Swin): only parameters whose name
# contains 'norm' (the backbone's LayerNorms) are exempt; biases, BatchNorms, LayerScale,
# temperatures, the position projection, neck and heads decay.
_base_ = 'mmdet::_base_/schedules/schedule_1x.py'
train_cfg = dict(max_epochs=36)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', by_epoch=True, begin=0, end=36, milestones=[27, 33], gamma=0.1),
]
# Mixed precision, float16 with a dynamic loss scale, as the official detection recipe
# (EpochBasedRunnerAmp, use_fp16=True): at 2 x 800 x 1344 per GPU XCiT-M24/8 needs 40.7 GiB
# in float32 and 28.3 GiB so, the other backbones 2-13 GiB (tools/analysis_tools/memory.py,
# docs/memory.md). AmpOptimWrapper needs a GPU.
optim_wrapper = dict(
    type='AmpOptimWrapper', dtype='float16', loss_scale='dynamic',
    constructor='vitdense.LayerDecayOptimWrapperConstructor',
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-4, betas=(0.9, 0.999),
                   weight_decay=0.05),
    paramwise_cfg=dict(weight_decay_rule='custom_keys',
                       custom_keys={'norm': dict(decay_mult=0.)},
                       layer_decay_rate=1.0))
