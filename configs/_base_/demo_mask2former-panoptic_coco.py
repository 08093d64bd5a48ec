# Demo recipe: Mask2Former panoptic (narrow head, small XCiT) from scratch on the demo COCO
# panoptic set (tools/data/make_demo_data.py panoptic: 128×128 images of 1-4 circles, squares
# and triangles over a striped wall and a checkered floor, clutter VOID), scored by mmdet's
# CocoPanopticMetric (PQ, SQ, RQ). The full recipe's layers with the head 128 wide, 20
# queries, 3 decoder and 2 pixel-decoder layers and 1,024 sampled points per mask (256, 100,
# 9, 6, 12,544 in mmdet's), native size without LSJ; family leaves swap the backbone.
_base_ = './mask2former-panoptic_columnar_lsj-50e_coco.py'
num_things_classes, num_stuff_classes = 3, 2
num_classes = num_things_classes + num_stuff_classes
width = 128
model = dict(
    data_preprocessor=dict(batch_augments=None),
    backbone=dict(arch=dict(_delete_=True, embed_dims=128, num_layers=6, num_heads=4),
                  patch_size=8, drop_path_rate=0.0, pyramid_norm_cfg=dict(type='BN'),
                  norm_cfg=dict(type='BN'), init_cfg=None),
    panoptic_head=dict(
        in_channels=[128] * 4, feat_channels=width, out_channels=width,
        num_things_classes=num_things_classes, num_stuff_classes=num_stuff_classes,
        num_queries=20,
        pixel_decoder=dict(encoder=dict(num_layers=2, layer_cfg=dict(
            self_attn_cfg=dict(embed_dims=width, num_heads=4),
            ffn_cfg=dict(embed_dims=width, feedforward_channels=4 * width))),
            positional_encoding=dict(num_feats=width // 2)),
        positional_encoding=dict(num_feats=width // 2),
        transformer_decoder=dict(num_layers=3, layer_cfg=dict(
            self_attn_cfg=dict(embed_dims=width, num_heads=4),
            cross_attn_cfg=dict(embed_dims=width, num_heads=4),
            ffn_cfg=dict(embed_dims=width, feedforward_channels=4 * width))),
        loss_cls=dict(class_weight=[1.0] * num_classes + [0.1])),
    panoptic_fusion_head=dict(num_things_classes=num_things_classes,
                              num_stuff_classes=num_stuff_classes),
    train_cfg=dict(num_points=1024),
    test_cfg=dict(max_per_image=20))

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
val_evaluator = dict(_delete_=True, type='CocoPanopticMetric',
                     ann_file=data_root + 'annotations/panoptic_val.json',
                     seg_prefix=data_root + 'annotations/panoptic_val/')
test_evaluator = val_evaluator

# The demo schedule of ./schedules/demo_adamw_iters.py (AdamW, lr 1e-3, weight decay 0.05 by
# the 'timm' rule, 50-iteration warmup, linear decay), written out: a base may not set what
# the host recipe above sets (mmengine refuses keys repeated among bases).
max_iters = 700
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=max_iters,
                 val_interval=max_iters)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=50),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=50, end=max_iters),
]
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='vitdense.LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(weight_decay_rule='timm'),
    clip_grad=dict(max_norm=5.0))
default_hooks = dict(
    logger=dict(interval=25, log_metric_by_epoch=False),
    checkpoint=dict(by_epoch=False, interval=max_iters, max_keep_ckpts=1,
                    save_last=False))
log_processor = dict(by_epoch=False, window_size=25)
