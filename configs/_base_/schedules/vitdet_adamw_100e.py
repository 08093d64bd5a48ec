# ViTDet's COCO schedule for ViT-B (§4, detectron2 projects/ViTDet): 100 epochs at batch 64
# (184,375 iterations), AdamW lr 1e-4, weight decay 0.1 except norms and the position
# table, 250-iteration linear warmup, lr /10 at iterations 163,889 and 177,546, layer-wise
# lr decay 0.7 (leaves state other values), evaluation every 5,000 iterations at the end.
# Mixed precision (float16, dynamic loss scale) as ViTDet trains (train.amp.enabled); it needs
# a GPU. Training memory per config: tools/analysis_tools/memory.py, docs/memory.md.
max_iters = 184375
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=5000)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=250),
    dict(type='MultiStepLR', by_epoch=False, begin=0, end=max_iters,
         milestones=[163889, 177546], gamma=0.1),
]
optim_wrapper = dict(
    type='AmpOptimWrapper', dtype='float16', loss_scale='dynamic',
    constructor='vitdense.LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
    paramwise_cfg=dict(weight_decay_rule='custom_keys',
                       custom_keys={'norm': dict(decay_mult=0.),
                                    'pos_embed': dict(decay_mult=0.)},
                       layer_decay_rate=0.7))
auto_scale_lr = dict(enable=False, base_batch_size=64)
