# Recipe: ./mask2former_columnar-adapter_160k_ade20k.py at 896×896, the crop of ViT-Adapter's
# largest Mask2Former recipe (the official mask2former_beit_adapter_large_896_80k_ade20k_ss.py)
# and of the DINOv2 / DINOv3 papers' ADE20k segmenters: resize of (3584, 896) × 0.5-2, 896²
# crops, 200 queries, the adapter and trunk recomputed in backward (`with_cp`, as the official
# 896 recipe), evaluation at short side 896 in 896² windows at stride 512, `--tta` at
# 0.5-1.75 × (3584, 896). The 160k iterations of the 640 recipe: the official 896 one trains
# 80k from a COCO-Stuff segmenter, which is not shipped.
_base_ = './mask2former_columnar-adapter_160k_ade20k.py'
crop_size = (896, 896)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(with_cp=True, backbone=dict(with_cp=True)),
    decode_head=dict(num_queries=200),
    test_cfg=dict(crop_size=crop_size, stride=(512, 512)))
train_pipeline = _base_.train_pipeline[:2] + [
    dict(type='RandomResize', scale=(3584, 896), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
] + _base_.train_pipeline[4:]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(3584, 896), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
tta_pipeline = [
    _base_.ade20k_tta_pipeline[0],
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale=(int(3584 * ratio), int(896 * ratio)), keep_ratio=True)
         for ratio in _base_.ade20k_tta_ratios]] + _base_.ade20k_tta_pipeline[1].transforms[1:]),
]
