# ImageNet-1k with the A2 augmentation of Wightman et al. ("ResNet strikes back"), the baseline
# procedure of "Three things everyone should know about ViTs" (§2.2): random-resized crop,
# flip, RandAugment m7-mstd0.5, repeated augmentation; Mixup 0.1 / CutMix 1.0 and the BCE loss
# live in the model; the augmentations run on the device (see the base). Evaluation: resize to
# 236, centre crop 224 (crop ratio 0.95).
_base_ = ['./imagenet_bs128_deit_224.py']

data_preprocessor = dict(augments=[
    dict(type='RandomResizedCrop', scale=224, backend='pillow', interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(
        type='RandAugment',
        policies='timm_increasing',
        num_policies=2,
        total_level=10,
        magnitude_level=7,
        magnitude_std=0.5,
        hparams=dict(pad_val=[104, 116, 124], interpolation='bicubic')),  # BGR mean
])
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=236, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs'),
]
train_dataloader = dict(batch_size=256)
val_dataloader = dict(batch_size=256, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
