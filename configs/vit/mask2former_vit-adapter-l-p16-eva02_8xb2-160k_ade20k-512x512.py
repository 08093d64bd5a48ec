# Mask2Former, ADE20k 160k at 512×512, ViT-Adapter-L around EVA-02 L
# (rotary positions, SwiGLU, 14-px patch kernels resampled to 16 px); ViT-Adapter's 1024-wide head.
_base_ = '../_base_/mask2former_columnar-adapter_160k_ade20k.py'
model = dict(
    backbone=dict(**_base_.adapter_l, backbone=_base_.eva02_l),
    decode_head=dict(**_base_.mask2former_wide_head, in_channels=[1024] * 4))
