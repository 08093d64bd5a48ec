# The seeded demo COCO panoptic set (tools/data/make_demo_data.py panoptic): 128×128 images
# of 1-4 circles, squares and triangles (things) over a striped wall and a checkered floor
# (stuff), clutter VOID; native size (the Resize only records the scale factor mmdet needs),
# random flips, batch 4 on one CPU; scored by mmdet's CocoPanopticMetric (PQ, SQ, RQ).
_base_ = 'mmdet::_base_/datasets/coco_panoptic.py'
data_root = 'data/demo_coco_panoptic/'
metainfo = dict(classes=('circle', 'square', 'triangle', 'wall', 'floor'),
                thing_classes=('circle', 'square', 'triangle'), stuff_classes=('wall', 'floor'),
                palette=[(210, 50, 50), (50, 180, 60), (50, 80, 215), (180, 150, 100),
                         (110, 110, 110)])
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadPanopticAnnotations'),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5, direction=['horizontal', 'vertical']),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='LoadPanopticAnnotations'),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=4, num_workers=1, persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    batch_sampler=None,
    dataset=dict(data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/panoptic_train.json',
                 data_prefix=dict(img='train/', seg='annotations/panoptic_train/'),
                 filter_cfg=dict(filter_empty_gt=True, min_size=0), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4, num_workers=1, persistent_workers=False,
    dataset=dict(data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/panoptic_val.json',
                 data_prefix=dict(img='val/', seg='annotations/panoptic_val/'),
                 pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/panoptic_val.json',
                     seg_prefix=data_root + 'annotations/panoptic_val/')
test_evaluator = val_evaluator
