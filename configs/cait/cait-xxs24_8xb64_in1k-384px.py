# CaiT-XXS24 fine-tuned at 384x384 (↑384, CaiT §4.3) from its 224 checkpoint: DeiT fine-tuning
# procedure, position table resampled on load, evaluation crop ratio 1.0.
_base_ = [
    '../_base_/models/deit_cls_in1k-384px.py',
    '../_base_/datasets/imagenet_bs64_deit_384_crop1.py',
    '../_base_/deit_finetune_384px.py',
]

model = dict(
    backbone=dict(type='vitdense.CaiT', arch='xxs24', drop_path_rate=0.1),
    head=dict(in_channels=192),
    init_cfg=dict(checkpoint='work_dirs/cait-xxs24_8xb128_in1k/epoch_400.pth'))
