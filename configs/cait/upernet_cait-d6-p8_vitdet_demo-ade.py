# Demo in ViTDet's layout: the small CaiT of upernet_cait-d6-p8_demo-ade.py (talking heads within
# windows) with relative positions and the simple feature pyramid, from scratch.
_base_ = '../_base_/demo_upernet-vitdet_ade.py'
model = dict(backbone=dict(type='vitdense.CaiT', img_size=128, arch=dict(layer_scale=0.1),
                           **_base_.demo_windows))
