# Mask2Former, ADE20k 160k at 512×512, ViT-Adapter-B around DINOv3 ViT-B/16
# (LVD-1689M, rotary positions, 4 storage tokens, LayerScale).
_base_ = '../_base_/mask2former_columnar-adapter_160k_ade20k.py'
model = dict(
    backbone=dict(**_base_.adapter_b, backbone=_base_.dinov3_b),
    decode_head=dict(in_channels=[768] * 4))
