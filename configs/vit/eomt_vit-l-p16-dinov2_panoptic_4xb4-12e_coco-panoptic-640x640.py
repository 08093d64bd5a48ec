# EoMT-L, COCO panoptic, 640×640: the official recipe (tue-mps/eomt configs/dinov2/coco/
# panoptic/eomt_large_640.yaml with MaskClassificationPanoptic's and COCOPanoptic's defaults;
# docs/eomt.md lists where ours differs). DINOv2-L with 4 registers, its 14-px patch
# projection resampled to 16 px as the official ViT builds it and its position table to the
# 40×40 grid; 200 queries in the last 4 blocks; 80 thing and 53 stuff classes, scored by
# CocoPanopticMetric (PQ). Weights: timm's vit_large_patch14_reg4_dinov2 (DINOv2's release),
# put at the path below; COCO panoptic under data/coco as mmdet lays it out.
_base_ = [
    '../_base_/models/eomt-panoptic_columnar.py', 'mmdet::_base_/datasets/coco_panoptic.py',
    '../_base_/default_runtime_mmdet.py'
]
image_size = (640, 640)
model = dict(
    # every batch padded to 640² (the test images' long side, at most the training crops'
    # sides), as the official code pads each image
    data_preprocessor=dict(pad_size_divisor=640),
    backbone=dict(backbone=dict(
        arch='large', patch_size=16, img_size=640, reg_tokens=4, no_embed_class=True,
        layer_scale=1e-5, resample_patch_embed=True,
        init_cfg=dict(type='Pretrained',
                      checkpoint='checkpoints/vit_large_patch14_reg4_dinov2.lvd142m.pth'))))
# the official augmentation: flip, scale jitter 0.1-2.0 of 640 (aspect kept), a 640² crop, no
# colour jitter; evaluation at long side 640
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadPanopticAnnotations', with_bbox=True, with_mask=True, with_seg=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomResize', scale=image_size, ratio_range=(0.1, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=image_size, crop_type='absolute', recompute_bbox=True,
         allow_negative_crop=True),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadPanopticAnnotations'),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
# batch 16 (4 GPUs × 4, the official README's rule)
train_dataloader = dict(
    batch_size=4, num_workers=4, sampler=dict(type='InfiniteSampler', shuffle=True),
    batch_sampler=None, dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
# 12 epochs of 7,391 iterations (the official annealing steps are multiples of its epoch:
# 14,782 = 2 epochs), evaluated after each epoch as the official trainer does
epoch_iters = 7391
max_iters = 12 * epoch_iters
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=epoch_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
# the masks of the 4 blocks annealed away one after another (the official steps, poly 0.9)
custom_hooks = [
    dict(type='vitdense.EoMTMaskAnnealingHook', start_iters=[14782, 29564, 44346, 59128],
         end_iters=[29564, 44346, 59128, 73910], power=0.9)
]
# AdamW, lr 1e-4, weight decay 0.05 on every parameter, layer-wise lr decay 0.8 counted as the
# official code counts blocks (EoMT.get_layer_depth); warmup 1,500 iterations (the official:
# heads 500, then the ViT 1,000), then poly 0.9 to zero: as the ADE20k recipe
# (eomt_vit-l-p16-dinov2_4xb4-39k_ade20k-512x512.py)
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
    logger=dict(interval=50, log_metric_by_epoch=False),
    checkpoint=dict(by_epoch=False, interval=epoch_iters, max_keep_ckpts=3))
log_processor = dict(by_epoch=False)
auto_scale_lr = dict(enable=False, base_batch_size=16)
