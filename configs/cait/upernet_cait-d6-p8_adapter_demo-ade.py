# Demo in ViT-Adapter's layout: the small CaiT of upernet_cait-d6-p8_demo-ade.py (LayerScale
# 0.1; its class-attention stage is classification-only) from scratch on the demo ADE20k set.
_base_ = '../_base_/demo_upernet-adapter_ade.py'
model = dict(backbone=dict(backbone=dict(type='vitdense.CaiT', img_size=128,
                                         arch=dict(layer_scale=0.1))))
