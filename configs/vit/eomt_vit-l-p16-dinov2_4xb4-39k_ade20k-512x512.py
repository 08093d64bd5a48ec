# EoMT-L, ADE20k semantic, 512×512: the official recipe (tue-mps/eomt configs/dinov2/ade20k/
# semantic/eomt_large_512.yaml with MaskClassificationSemantic's defaults; docs/eomt.md lists
# each setting and where ours differs). DINOv2-L with 4 registers, its 14-px patch projection
# resampled to 16 px as the official ViT builds it (timm's patch_size=16) and its position
# table to the 32×32 grid; 100 queries in the last 4 blocks. Weights: timm's
# vit_large_patch14_reg4_dinov2 (DINOv2's release), put at the path below.
_base_ = [
    '../_base_/models/eomt_columnar.py', '../_base_/datasets/ade20k_512x512.py',
    '../_base_/default_runtime_mmseg.py'
]
custom_imports = dict(imports=['vitdense', 'vitdense.seg'], allow_failed_imports=False)
model = dict(
    backbone=dict(backbone=dict(
        arch='large', patch_size=16, img_size=512, reg_tokens=4, no_embed_class=True,
        layer_scale=1e-5, resample_patch_embed=True,
        init_cfg=dict(type='Pretrained',
                      checkpoint='checkpoints/vit_large_patch14_reg4_dinov2.lvd142m.pth'))),
    # the official evaluation: short side 512, then 512×512 windows along the long side
    test_cfg=dict(mode='slide', crop_size=(512, 512), stride=(512, 512)))
# batch 16 (4 GPUs × 4, the official README's rule); 31 epochs of ADE20k's 20,210 images with
# the last partial batch dropped: 31 × 1,263 iterations
train_dataloader = dict(batch_size=4)
max_iters = 39153
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=4000)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
# the masks of the 4 blocks annealed away one after another (the official steps, poly 0.9)
custom_hooks = [
    dict(type='vitdense.EoMTMaskAnnealingHook', start_iters=[6520, 13040, 19560, 26080],
         end_iters=[13040, 19560, 26080, 32600], power=0.9)
]
# AdamW, lr 1e-4, weight decay 0.05 on every parameter (the official optimizer has no
# exemptions), layer-wise lr decay 0.8 counted as the official code counts blocks
# (EoMT.get_layer_depth); warmup 1,500 iterations (the official: heads 500, then the ViT
# 1,000), then poly 0.9 to zero
optim_wrapper = dict(
    type='OptimWrapper',
    constructor='vitdense.LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(weight_decay_rule='custom_keys', layer_decay_rate=0.8))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=0.9, by_epoch=False, begin=1500, end=max_iters),
]
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='vitdense.SafeCheckpointHook', by_epoch=False, interval=4000,
                    max_keep_ckpts=3),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='SegVisualizationHook'))
auto_scale_lr = dict(enable=False, base_batch_size=16)
