# Demo: Mask2Former in ViT-Adapter's layout with the small ViT of upernet_vit-d6-p8_demo-ade.py
# (no class token in the trunk, as the official DeiT adapter) from scratch on the demo
# ADE20k-layout set.
_base_ = '../_base_/demo_mask2former-adapter_ade.py'
model = dict(backbone=dict(backbone=dict(type='vitdense.ViT', img_size=128,
                                         dense_class_token=False)))
