# ViT-S/16 baseline of "Three things everyone should know about ViTs" (§2.2): the A2 procedure
# (BCE, LAMB lr 4e-3 at batch 8 x 256 = 2048, 300 epochs), stochastic depth 0.05 for S.
_base_ = [
    '../_base_/models/a2_cls_in1k.py',
    '../_base_/datasets/imagenet_bs256_a2_224.py',
    '../_base_/schedules/a2_lamb_300e.py',
    '../_base_/default_runtime_mmpretrain.py',
]

model = dict(
    backbone=dict(type='vitdense.ViT', arch='small', drop_path_rate=0.05),
    head=dict(in_channels=384))
