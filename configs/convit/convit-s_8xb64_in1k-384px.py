# ConViT-S fine-tuned at 384x384 from its 224 checkpoint: DeiT fine-tuning procedure, the
# position table resampled on load, evaluation crop ratio 0.875.
_base_ = [
    '../_base_/models/deit_cls_in1k-384px.py',
    '../_base_/datasets/imagenet_bs64_deit_384.py',
    '../_base_/deit_finetune_384px.py',
]

model = dict(
    backbone=dict(type='vitdense.ConViT', arch='small', drop_path_rate=0.1),
    head=dict(in_channels=432),
    init_cfg=dict(checkpoint='work_dirs/convit-s_8xb128_in1k/epoch_300.pth'))
