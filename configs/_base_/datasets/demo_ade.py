# The seeded demo ADE20k-layout set (tools/data/make_demo_data.py ade): 128×128 images, wall /
# floor textures behind circles, squares and triangles; label 0 (clutter) is ignored as in
# ADE20k (reduce_zero_label). Native size, random flips, batch 8 on one CPU. `--tta`: the
# ADE20k recipes' ratios 0.5-1.75 of the native size, each unflipped and flipped.
_base_ = 'mmseg::_base_/datasets/ade20k.py'
dataset_type = 'BaseSegDataset'
data_root = 'data/demo_ade'
metainfo = dict(classes=('wall', 'floor', 'circle', 'square', 'triangle'),
                palette=[[120, 120, 120], [80, 50, 50], [220, 20, 60], [0, 160, 0],
                         [30, 60, 230]])
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomFlip', prob=0.5, direction=['horizontal', 'vertical']),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(
    batch_size=8, num_workers=1,
    dataset=dict(type=dataset_type, data_root=data_root, metainfo=metainfo,
                 img_suffix='.jpg', seg_map_suffix='.png', reduce_zero_label=True,
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=8, num_workers=1,
    dataset=dict(type=dataset_type, data_root=data_root, metainfo=metainfo,
                 img_suffix='.jpg', seg_map_suffix='.png', reduce_zero_label=True,
                 pipeline=test_pipeline))
test_dataloader = val_dataloader
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale_factor=ratio, keep_ratio=True)
         for ratio in (0.5, 0.75, 1.0, 1.25, 1.5, 1.75)],
        [dict(type='RandomFlip', prob=0., direction='horizontal'),
         dict(type='RandomFlip', prob=1., direction='horizontal')],
        [dict(type='LoadAnnotations', reduce_zero_label=True)],
        [dict(type='PackSegInputs')]]),
]
