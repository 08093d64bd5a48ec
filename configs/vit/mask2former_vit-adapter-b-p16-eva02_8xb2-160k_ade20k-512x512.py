# Mask2Former, ADE20k 160k at 512×512, ViT-Adapter-B around EVA-02 B
# (rotary positions, SwiGLU, 14-px patch kernels resampled to 16 px).
_base_ = '../_base_/mask2former_columnar-adapter_160k_ade20k.py'
model = dict(
    backbone=dict(**_base_.adapter_b, backbone=_base_.eva02_b),
    decode_head=dict(in_channels=[768] * 4))
