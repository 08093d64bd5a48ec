# Recipe: Mask2Former semantic segmentation (mmseg's head, matcher and losses) on a columnar
# backbone in ViT-Adapter's layout, ADE20k 160k iterations at 512×512, batch 16 (8 × 2), as
# ViT-Adapter's Mask2Former recipe (Chen et al., ICLR 2023; the official
# mask2former_beit_adapter_large_640_160k_ade20k_ss.py at this crop): AdamW lr 2e-5,
# weight decay 0.05 (none on one-dimensional parameters and the trunk's no_weight_decay() names),
# layer-wise lr decay 0.9 over the trunk's blocks (the adapter and the head at the full rate),
# 1500-iteration linear warmup then poly (power 1) decay; mmseg's Mask2Former gradient
# clipping (norm 0.01). ADE20k's standard augmentation as ViT-Adapter trains (resize of
# (2048, 512) × 0.5-2, 512² crop, flip, photometric); the map after interaction i added to
# level i (the official segmentation code); evaluation as the official configs: short side
# 512, 512² sliding windows at stride 341. Leaves set the trunk (./models/foundation_trunks.py),
# the adapter's heads and the head's input widths.
_base_ = ['mmseg::mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py',
          './models/vit-adapter.py', './models/foundation_trunks.py',
          './models/mask2former_wide-head.py', './datasets/ade20k_tta.py']
# what ./default_runtime_mmseg.py sets (the host config brings mmseg's runtime): the vitdense
# modules and mmdet's (the head's parts) imported, atomic weights-only checkpoints, a seed per
# process
custom_imports = dict(imports=['vitdense', 'mmdet.models'], allow_failed_imports=False)
default_hooks = dict(checkpoint=dict(type='vitdense.SafeCheckpointHook', max_keep_ckpts=3))
randomness = dict(seed=None, diff_rank_seed=True)
model = dict(
    backbone=dict(_base_.vit_adapter, _delete_=True, vit_features='per_interaction'),
    decode_head=dict(in_channels=[384] * 4),
    test_cfg=dict(mode='slide', crop_size=(512, 512), stride=(341, 341)))
crop_size = (512, 512)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(2048, 512), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
tta_pipeline = _base_.ade20k_tta_pipeline
max_iters = 160000
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='vitdense.LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=2e-5, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(weight_decay_rule='timm', layer_decay_rate=0.9),
    clip_grad=dict(max_norm=0.01, norm_type=2))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=1500, end=max_iters),
]
