# ConViT-S on ImageNet-1k with the unchanged DeiT recipe (d'Ascoli et al. §4): batch 8 x 128 =
# 1024, AdamW lr 1e-3, 300 epochs, stochastic depth 0.1, evaluation crop ratio 0.875.
_base_ = [
    '../_base_/models/deit_cls_in1k.py',
    '../_base_/datasets/imagenet_bs128_deit_224.py',
    '../_base_/schedules/deit_adamw_300e.py',
    '../_base_/default_runtime_mmpretrain.py',
]

model = dict(
    backbone=dict(type='vitdense.ConViT', arch='small', drop_path_rate=0.1),
    head=dict(in_channels=432))
