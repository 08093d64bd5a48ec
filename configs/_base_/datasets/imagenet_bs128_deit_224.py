# ImageNet-1k with the DeiT training augmentation (Touvron et al. 2021, Table 9), shared by CaiT,
# XCiT and ConViT: bicubic random-resized crop, flip, RandAugment m9-mstd0.5, random erasing
# 0.25 and repeated augmentation (3 repeats); Mixup/CutMix and label smoothing live in the model.
# The loader's workers only read and decode (vitdense.LoadImageTensor); the augmentations, the
# same mmpretrain transform dicts a CPU pipeline would list, run batched on the GPU in the data
# preprocessor (vitdense.DeviceAugmentPreprocessor, docs/recipes.md). LoadImageTensor with
# decode=False leaves decoding to the GPU too.
# Evaluation: resize to 256, centre crop 224 (crop ratio 0.875), on the CPU.
# Expects data/imagenet/{train,val} and data/imagenet/meta/{train,val}.txt.
dataset_type = 'ImageNet'
data_root = 'data/imagenet'
rgb_mean = [123.675, 116.28, 103.53]
rgb_std = [58.395, 57.12, 57.375]
bgr_mean = rgb_mean[::-1]  # the augmentations' colours are in the loader's BGR order
bgr_std = rgb_std[::-1]

rand_augment = dict(
    type='RandAugment',
    policies='timm_increasing',
    num_policies=2,
    total_level=10,
    magnitude_level=9,
    magnitude_std=0.5,
    hparams=dict(pad_val=[round(x) for x in bgr_mean], interpolation='bicubic'))
random_erasing = dict(
    type='RandomErasing',
    erase_prob=0.25,
    mode='rand',
    min_area_ratio=0.02,
    max_area_ratio=1 / 3,
    fill_color=bgr_mean,
    fill_std=bgr_std)

data_preprocessor = dict(
    type='vitdense.DeviceAugmentPreprocessor',
    augments=[
        dict(type='RandomResizedCrop', scale=224, backend='pillow', interpolation='bicubic'),
        dict(type='RandomFlip', prob=0.5, direction='horizontal'),
        rand_augment,
        random_erasing,
    ],
    num_classes=1000,
    mean=rgb_mean,
    std=rgb_std,
    to_rgb=True)

train_pipeline = [dict(type='vitdense.LoadImageTensor'), dict(type='PackInputs')]

test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=256, edge='short', backend='pillow', interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs'),
]

train_dataloader = dict(
    batch_size=128,
    num_workers=8,
    persistent_workers=True,
    dataset=dict(type=dataset_type, data_root=data_root, split='train',
                 pipeline=train_pipeline),
    sampler=dict(type='RepeatAugSampler', shuffle=True, num_repeats=3),
)
val_dataloader = dict(
    batch_size=128,
    num_workers=8,
    persistent_workers=True,
    dataset=dict(type=dataset_type, data_root=data_root, split='val', pipeline=test_pipeline),
    sampler=dict(type='DefaultSampler', shuffle=False),
)
val_evaluator = dict(type='Accuracy', topk=(1, 5))

test_dataloader = val_dataloader
test_evaluator = val_evaluator
