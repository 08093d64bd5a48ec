# Mask2Former, ADE20k 160k at 512×512, ViT-Adapter-L around DINOv3 ViT-L/16
# (LVD-1689M, rotary positions, 4 storage tokens, LayerScale); ViT-Adapter's 1024-wide head.
_base_ = '../_base_/mask2former_columnar-adapter_160k_ade20k.py'
model = dict(
    backbone=dict(**_base_.adapter_l, backbone=_base_.dinov3_l),
    decode_head=dict(**_base_.mask2former_wide_head, in_channels=[1024] * 4))
