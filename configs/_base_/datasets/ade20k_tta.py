# `--tta` on ADE20k as the papers evaluate (BEiT, ViT-Adapter, DINOv2): 0.5-1.75 × the single
# scale (2048, 512), each unflipped and flipped; mmseg's own tta_pipeline scales the image as
# loaded instead. A variable: the recipes on mmseg's own configs set it over theirs.
ade20k_tta_ratios = (0.5, 0.75, 1.0, 1.25, 1.5, 1.75)
ade20k_tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale=(int(2048 * ratio), int(512 * ratio)), keep_ratio=True)
         for ratio in ade20k_tta_ratios],
        [dict(type='RandomFlip', prob=0., direction='horizontal'),
         dict(type='RandomFlip', prob=1., direction='horizontal')],
        [dict(type='LoadAnnotations', reduce_zero_label=True)],
        [dict(type='PackSegInputs')]]),
]
