# Mask2Former instance, COCO 50 epochs LSJ, ViT-Adapter-B around DINOv3 ViT-B/16
# (LVD-1689M, rotary positions, 4 storage tokens, LayerScale).
_base_ = '../_base_/mask2former_columnar-adapter_lsj-50e_coco.py'
model = dict(
    backbone=dict(**_base_.adapter_b, backbone=_base_.dinov3_b),
    panoptic_head=dict(in_channels=[768] * 4))
