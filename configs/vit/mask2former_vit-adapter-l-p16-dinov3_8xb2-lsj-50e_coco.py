# Mask2Former instance, COCO 50 epochs LSJ, ViT-Adapter-L around DINOv3 ViT-L/16
# (LVD-1689M, rotary positions, 4 storage tokens, LayerScale).
_base_ = '../_base_/mask2former_columnar-adapter_lsj-50e_coco.py'
model = dict(
    backbone=dict(**_base_.adapter_l, backbone=_base_.dinov3_l),
    panoptic_head=dict(in_channels=[1024] * 4))
