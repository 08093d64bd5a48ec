# DeiT fine-tuning at a higher resolution (↑384): 30 epochs of AdamW at a constant lr 5e-6 for a
# batch of 512 (8 x 64) and a vanishing weight decay 1e-8, starting from the 224 weights.
optim_wrapper = dict(
    constructor='vitdense.LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=5e-6, weight_decay=1e-8, eps=1e-8, betas=(0.9, 0.999)),
    paramwise_cfg=dict(weight_decay_rule='custom_keys', norm_decay_mult=0.0,
                       bias_decay_mult=0.0, flat_decay_mult=0.0),
)
param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=True, begin=0)]

train_cfg = dict(by_epoch=True, max_epochs=30, val_interval=1)
val_cfg = dict()
test_cfg = dict()

auto_scale_lr = dict(base_batch_size=512)
