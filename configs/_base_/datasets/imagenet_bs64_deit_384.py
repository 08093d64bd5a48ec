# DeiT augmentation at 384x384 for fine-tuning a 224 model at higher resolution (↑384).
# Evaluation: resize to 438, centre crop 384 (crop ratio 0.875).
_base_ = ['./imagenet_bs128_deit_224.py']

data_preprocessor = dict(augments=[
    dict(type='RandomResizedCrop', scale=384, backend='pillow', interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    {{_base_.rand_augment}},
    {{_base_.random_erasing}},
])
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=438, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=384),
    dict(type='PackInputs'),
]
train_dataloader = dict(batch_size=64)
val_dataloader = dict(batch_size=64, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
