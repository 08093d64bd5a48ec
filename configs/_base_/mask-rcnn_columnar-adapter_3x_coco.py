# Recipe: Mask R-CNN + FPN on a columnar backbone in ViT-Adapter's layout, COCO 3x with
# multi-scale training (Chen et al., ICLR 2023, Table 1; the official
# mask_rcnn_deit_adapter_*_fpn_3x_coco.py): DETR's augmentation ending in a random crop of at
# most 1024×1024, AdamW lr 1e-4, weight decay 0.05 at batch 16, no layer-wise decay, level
# embeddings, position tables, norms and biases without weight decay, float32 (the official
# recipe leaves fp16 off). Family leaves set the trunk, its checkpoint and the neck's widths.
_base_ = ['./mask-rcnn_columnar_3x_coco.py', './models/vit-adapter.py']
model = dict(
    backbone=dict(_delete_=True, **_base_.vit_adapter),
    neck=dict(in_channels=[384] * 4))
# DETR's augmentation of the 3x base, then the official recipe's crop of at most 1024×1024
train_pipeline = _base_.train_pipeline[:-1] + [
    dict(type='RandomCrop', crop_type='absolute_range', crop_size=(1024, 1024),
         allow_negative_crop=True),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='vitdense.LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(weight_decay_rule='custom_keys',
                       custom_keys={'level_embed': dict(decay_mult=0.),
                                    'pos_embed': dict(decay_mult=0.),
                                    'norm': dict(decay_mult=0.),
                                    'bias': dict(decay_mult=0.)}))
