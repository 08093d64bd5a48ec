# Mask2Former panoptic, COCO panoptic 50 epochs LSJ, ViT-Adapter-B around EVA-02 B
# (rotary positions, SwiGLU, 14-px patch kernels resampled to 16 px).
_base_ = '../_base_/mask2former-panoptic_columnar-adapter_lsj-50e_coco.py'
model = dict(
    backbone=dict(**_base_.adapter_b, backbone=_base_.eva02_b),
    panoptic_head=dict(in_channels=[768] * 4))
