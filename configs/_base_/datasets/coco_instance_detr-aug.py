# COCO instance segmentation, 2 images per GPU, with DETR's multi-scale training augmentation
# (XCiT paper §4.2): random flip, then either a random short side in 480..800 or a resize to
# 400..600, a random 384..600 crop and a random short side in 480..800 (long side <= 1333).
# Tested single-scale at 1333×800 (mmdet's test pipeline); `--tta`: mmdet's three scales,
# each unflipped and flipped.
_base_ = 'mmdet::_base_/datasets/coco_instance.py'
short_sides = [480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800]
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(
        type='RandomChoice',
        transforms=[
            [dict(type='RandomChoiceResize', scales=[(s, 1333) for s in short_sides],
                  keep_ratio=True)],
            [dict(type='RandomChoiceResize', scales=[(400, 1333), (500, 1333), (600, 1333)],
                  keep_ratio=True),
             dict(type='RandomCrop', crop_type='absolute_range', crop_size=(384, 600),
                  allow_negative_crop=True),
             dict(type='RandomChoiceResize', scales=[(s, 1333) for s in short_sides],
                  keep_ratio=True)],
        ]),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(batch_size=2, num_workers=2, dataset=dict(pipeline=train_pipeline))
tta_scales = [(1333, 800), (666, 400), (2000, 1200)]
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale=scale, keep_ratio=True) for scale in tta_scales],
        [dict(type='RandomFlip', prob=0.), dict(type='RandomFlip', prob=1.)],
        [dict(type='LoadAnnotations', with_bbox=True, with_mask=True)],
        [dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                                               'scale_factor', 'flip', 'flip_direction'))]]),
]
