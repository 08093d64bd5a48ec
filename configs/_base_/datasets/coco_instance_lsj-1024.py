# COCO instance segmentation with large-scale jitter at 1024² (ViTDet §4, after Ghiasi et al.,
# 2021): the image resized to 0.1-2.0 × 1024 (aspect kept), a 1024² crop, flips; the model's
# data preprocessor pads every batch to 1024². Tested at long side 1024; `--tta`: long sides
# 768, 1024 and 1280, each padded to its square as the single scale is, unflipped and flipped.
_base_ = 'mmdet::_base_/datasets/coco_instance.py'
image_size = (1024, 1024)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomResize', scale=image_size, ratio_range=(0.1, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_type='absolute_range', crop_size=image_size,
         recompute_bbox=True, allow_negative_crop=True),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1e-2, 1e-2)),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='Pad', size=image_size, pad_val=dict(img=(114, 114, 114))),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=4, num_workers=4,
    sampler=dict(type='InfiniteSampler', shuffle=True), batch_sampler=None,
    dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
tta_sides = (768, 1024, 1280)
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Compose', transforms=[
            dict(type='Resize', scale=(side, side), keep_ratio=True),
            dict(type='Pad', size=(side, side), pad_val=dict(img=(114, 114, 114)))])
         for side in tta_sides],
        [dict(type='RandomFlip', prob=0.), dict(type='RandomFlip', prob=1.)],
        [dict(type='LoadAnnotations', with_bbox=True, with_mask=True)],
        [dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                                               'scale_factor', 'flip', 'flip_direction'))]]),
]
