# Demo in ViTDet's layout: the small ViT of upernet_vit-d6-p8_demo-ade.py with window attention,
# relative positions and the simple feature pyramid, from scratch on the demo ADE20k-layout set.
_base_ = '../_base_/demo_upernet-vitdet_ade.py'
model = dict(backbone=dict(type='vitdense.ViT', img_size=128, **_base_.demo_windows))
