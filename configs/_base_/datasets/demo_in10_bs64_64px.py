# The seeded demo ImageNet (tools/data/make_demo_data.py imagenet: 10 procedurally drawn classes,
# 72x72 images in the ImageNet layout under data/demo_in10) with the DeiT augmentation scaled
# to 64x64: the random-resized crop keeps at least 35% of the image so a shape stays visible;
# evaluation crop ratio 0.875. Repeated augmentation is off: it exists to place an image's
# repeats on different GPUs, and the demo runs on one process.
_base_ = ['./imagenet_bs128_deit_224.py']

data_root = 'data/demo_in10'
classes = ('circle', 'square', 'triangle', 'cross', 'ring', 'star', 'hstripes', 'vstripes',
           'checkerboard', 'dots')
data_preprocessor = dict(num_classes=10, augments=[
    dict(type='RandomResizedCrop', scale=64, crop_ratio_range=(0.35, 1.0), backend='pillow',
         interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    {{_base_.rand_augment}},
    {{_base_.random_erasing}},
])

test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=73, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=64),
    dict(type='PackInputs'),
]

train_dataloader = dict(
    batch_size=64,
    num_workers=1,
    dataset=dict(data_root=data_root, metainfo=dict(classes=classes)),
    sampler=dict(_delete_=True, type='DefaultSampler', shuffle=True),
)
val_dataloader = dict(
    batch_size=100,
    num_workers=1,
    dataset=dict(data_root=data_root, metainfo=dict(classes=classes), pipeline=test_pipeline),
)
test_dataloader = val_dataloader
