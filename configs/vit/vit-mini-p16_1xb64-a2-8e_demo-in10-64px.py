# Demo: the "Three things" A2 ViT recipe (BCE, LAMB, Mixup 0.1 / CutMix 1.0) end to end on the
# 10-class demo set (64x64, patch 16) with a small ViT (d=128, 6 blocks, 4 heads).
# Generate the data first: python tools/data/make_demo_data.py imagenet
_base_ = [
    '../_base_/models/a2_cls_in1k.py',
    '../_base_/datasets/demo_in10_bs64_64px.py',
    '../_base_/schedules/demo_in10_lamb_8e.py',
    '../_base_/default_runtime_mmpretrain.py',
]

model = dict(
    backbone=dict(type='vitdense.ViT', arch=dict(embed_dims=128, num_layers=6, num_heads=4),
                  img_size=64, patch_size=16, drop_path_rate=0.0),
    head=dict(num_classes=10, in_channels=128))
default_hooks = dict(logger=dict(interval=10), checkpoint=dict(interval=8, max_keep_ckpts=1))
