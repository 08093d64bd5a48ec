# Demo recipe: Mask2Former semantic segmentation in ViT-Adapter's layout from scratch on the
# demo ADE20k-layout set (tools/data/make_demo_data.py ade: 128×128, 5 classes), scored by
# mmseg's IoUMetric. The full recipe's layers (./mask2former_columnar-adapter_160k_ade20k.py)
# with the demo adapter (`demo_seg_adapter`, as the demo UperNet in the adapter's layout) and
# the head 128 wide, 20 queries, 3 decoder and 2 pixel-decoder layers and 1,024 sampled points
# per mask (mmseg's: 256, 100, 9, 6, 12,544), as the demo Mask2Former panoptic
# (./demo_mask2former-panoptic_coco.py); native size, flips only, whole-image inference; the
# demo data and schedule (./datasets/demo_ade.py, ./schedules/demo_adamw_iters.py) written out,
# since mmengine refuses keys repeated among bases. Family leaves set the trunk's type and
# options.
_base_ = './mask2former_columnar-adapter_160k_ade20k.py'
num_classes = 5
width = 128
model = dict(
    data_preprocessor=dict(size=(128, 128)),
    backbone=dict(_delete_=True, **_base_.demo_seg_adapter),
    decode_head=dict(
        in_channels=[128] * 4, feat_channels=width, out_channels=width,
        num_classes=num_classes, num_queries=20,
        pixel_decoder=dict(encoder=dict(num_layers=2, layer_cfg=dict(
            self_attn_cfg=dict(embed_dims=width, num_heads=4),
            ffn_cfg=dict(embed_dims=width, feedforward_channels=4 * width))),
            positional_encoding=dict(num_feats=width // 2)),
        positional_encoding=dict(num_feats=width // 2),
        transformer_decoder=dict(num_layers=3, layer_cfg=dict(
            self_attn_cfg=dict(embed_dims=width, num_heads=4),
            cross_attn_cfg=dict(embed_dims=width, num_heads=4),
            ffn_cfg=dict(embed_dims=width, feedforward_channels=4 * width))),
        loss_cls=dict(class_weight=[1.0] * num_classes + [0.1]),
        train_cfg=dict(num_points=1024)),
    test_cfg=dict(_delete_=True, mode='whole'))

# the demo set of ./datasets/demo_ade.py
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
demo_dataset = dict(type=dataset_type, data_root=data_root, metainfo=metainfo,
                    data_prefix=dict(img_path='images/training',
                                     seg_map_path='annotations/training'),
                    img_suffix='.jpg', seg_map_suffix='.png', reduce_zero_label=True)
train_dataloader = dict(batch_size=8, num_workers=1,
                        dataset=dict(demo_dataset, pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=8, num_workers=1,
    dataset=dict(demo_dataset, pipeline=test_pipeline,
                 data_prefix=dict(img_path='images/validation',
                                  seg_map_path='annotations/validation')))
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

# the schedule of ./schedules/demo_adamw_iters.py: AdamW, lr 1e-3, weight decay 0.05 by the
# 'timm' rule, 50-iteration warmup, linear decay
max_iters = 700
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
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
    checkpoint=dict(by_epoch=False, interval=max_iters, max_keep_ckpts=1, save_best=None))
log_processor = dict(by_epoch=False)
