# XCiT-S12/16 on ImageNet-1k, DeiT recipe as in XCiT §4.1: batch 8 x 128 = 1024, AdamW lr 1e-3,
# 400 epochs, stochastic depth 0.05 (official XCiT setting), LayerScale 1.0 from the arch
# table, evaluation crop ratio 1.0.
_base_ = [
    '../_base_/models/deit_cls_in1k.py',
    '../_base_/datasets/imagenet_bs128_deit_224_crop1.py',
    '../_base_/schedules/deit_adamw_400e.py',
    'mmpretrain::_base_/default_runtime.py',
]

model = dict(
    backbone=dict(type='vitdense.XCiT', arch='small_12', drop_path_rate=0.05),
    head=dict(in_channels=384))
