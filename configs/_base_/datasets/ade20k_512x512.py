# ADE20k, 512×512 random crops, 2 images per GPU (8xb2 = batch 16, XCiT paper §4.3),
# single-scale evaluation at short side 512. `--tta`: the papers' multi-scale + flip (BEiT,
# ViT-Adapter, DINOv2): 0.5-1.75 × the single scale (2048, 512), each unflipped and flipped;
# mmseg's own tta_pipeline scales the image as loaded instead.
_base_ = 'mmseg::_base_/datasets/ade20k.py'
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = dict(batch_size=1)
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale=(int(2048 * ratio), int(512 * ratio)), keep_ratio=True)
         for ratio in (0.5, 0.75, 1.0, 1.25, 1.5, 1.75)],
        [dict(type='RandomFlip', prob=0., direction='horizontal'),
         dict(type='RandomFlip', prob=1., direction='horizontal')],
        [dict(type='LoadAnnotations', reduce_zero_label=True)],
        [dict(type='PackSegInputs')]]),
]
