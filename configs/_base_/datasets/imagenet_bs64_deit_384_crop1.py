# ↑384 fine-tuning data with the evaluation crop ratio 1.0 of CaiT and XCiT.
_base_ = ['./imagenet_bs64_deit_384.py']

test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=384, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=384),
    dict(type='PackInputs'),
]
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
