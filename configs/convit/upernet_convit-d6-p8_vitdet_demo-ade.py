# Demo in ViTDet's layout: the small ConViT of upernet_convit-d6-p8_demo-ade.py (GPSA and SA
# within windows, no class token) with relative positions and the simple feature pyramid.
_base_ = '../_base_/demo_upernet-vitdet_ade.py'
model = dict(backbone=dict(type='vitdense.ConViT', img_size=128, arch=dict(num_local_layers=5),
                           **_base_.demo_windows))
