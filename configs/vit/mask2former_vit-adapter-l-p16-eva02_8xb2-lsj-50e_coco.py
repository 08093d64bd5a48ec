# Mask2Former instance, COCO 50 epochs LSJ, ViT-Adapter-L around EVA-02 L
# (rotary positions, SwiGLU, 14-px patch kernels resampled to 16 px).
_base_ = '../_base_/mask2former_columnar-adapter_lsj-50e_coco.py'
model = dict(
    backbone=dict(**_base_.adapter_l, backbone=_base_.eva02_l),
    panoptic_head=dict(in_channels=[1024] * 4))
