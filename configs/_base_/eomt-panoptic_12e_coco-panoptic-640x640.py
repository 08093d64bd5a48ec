# Recipe: EoMT on COCO panoptic at 640×640 as the official code trains it (tue-mps/eomt
# configs/<backbone>/coco/panoptic/eomt_large_640.yaml with MaskClassificationPanoptic's and
# COCOPanoptic's defaults; docs/eomt.md lists where ours differs): 200 queries in the last 4
# blocks, 80 thing and 53 stuff classes scored by CocoPanopticMetric (PQ); batch 16, 12
# epochs, the official augmentation and schedule. Leaves set the backbone (a ViT at 640² with
# out_type='cls_token'), its weights, the learning rate, the warmup and the annealing steps.
_base_ = [
    './models/eomt-panoptic_columnar.py', 'mmdet::_base_/datasets/coco_panoptic.py',
    './default_runtime_mmdet.py'
]
image_size = (640, 640)
# every batch padded to 640² (the test images' long side, at most the training crops' sides),
# as the official code pads each image
model = dict(data_preprocessor=dict(pad_size_divisor=640))
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
# the masks of the 4 blocks annealed away one after another (the official DINOv2 steps, poly
# 0.9)
custom_hooks = [
    dict(type='vitdense.EoMTMaskAnnealingHook', start_iters=[14782, 29564, 44346, 59128],
         end_iters=[29564, 44346, 59128, 73910], power=0.9)
]
# AdamW, lr 1e-4, weight decay 0.05 on every parameter, layer-wise lr decay 0.8 counted as the
# official code counts blocks (EoMT.get_layer_depth); warmup 1,500 iterations (the official:
# heads 500, then the ViT 1,000), then poly 0.9 to zero: as the ADE20k recipe
# (configs/vit/eomt_vit-l-p16-dinov2_4xb4-39k_ade20k-512x512.py)
warmup_iters = 1500
optim_wrapper = dict(
    type='OptimWrapper',
    constructor='vitdense.LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(weight_decay_rule='custom_keys', layer_decay_rate=0.8))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=warmup_iters),
    dict(type='PolyLR', eta_min=0.0, power=0.9, by_epoch=False, begin=warmup_iters,
         end=max_iters),
]
default_hooks = dict(
    logger=dict(interval=50, log_metric_by_epoch=False),
    checkpoint=dict(by_epoch=False, interval=epoch_iters, max_keep_ckpts=3))
log_processor = dict(by_epoch=False)
auto_scale_lr = dict(enable=False, base_batch_size=16)
