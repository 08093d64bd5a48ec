# Mask2Former, ADE20k 160k at 512×512, ViT-Adapter-S around DINOv3 ViT-S/16
# (LVD-1689M, rotary positions, 4 storage tokens, LayerScale).
_base_ = '../_base_/mask2former_columnar-adapter_160k_ade20k.py'
model = dict(
    backbone=dict(**_base_.adapter_s, backbone=_base_.dinov3_s),
    decode_head=dict(in_channels=[384] * 4))
