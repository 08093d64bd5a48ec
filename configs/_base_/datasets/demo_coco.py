# The seeded demo COCO set (tools/data/make_demo_data.py coco): 160×160 images of 1-4
# coloured circles, squares and triangles; native size (the Resize only records the scale
# factor mmdet needs), random flips, batch 4 on one CPU. `--tta`: 120, 160 and 200 px, each
# unflipped and flipped.
_base_ = 'mmdet::_base_/datasets/coco_instance.py'
data_root = 'data/demo_coco/'
metainfo = dict(classes=('circle', 'square', 'triangle'),
                palette=[(220, 20, 60), (0, 160, 0), (30, 60, 230)])
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(160, 160), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5, direction=['horizontal', 'vertical']),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(160, 160), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=4, num_workers=1,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    batch_sampler=None,
    dataset=dict(data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/instances_train.json', data_prefix=dict(img='train/'),
                 filter_cfg=dict(filter_empty_gt=True, min_size=0), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4, num_workers=1,
    dataset=dict(data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/instances_val.json', data_prefix=dict(img='val/'),
                 pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale=(side, side), keep_ratio=True) for side in (120, 160, 200)],
        [dict(type='RandomFlip', prob=0.), dict(type='RandomFlip', prob=1.)],
        [dict(type='LoadAnnotations', with_bbox=True, with_mask=True)],
        [dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                                               'scale_factor', 'flip', 'flip_direction'))]]),
]
