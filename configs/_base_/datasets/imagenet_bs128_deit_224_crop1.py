# DeiT augmentation with the evaluation crop ratio 1.0 (resize to 224, no border cut) adopted
# by CaiT (§4.3, Table A.5) and XCiT (§4.1).
_base_ = ['./imagenet_bs128_deit_224.py']

test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=224, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs'),
]
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
