# Mask2Former panoptic, COCO panoptic 50 epochs LSJ, ViT-Adapter-S around DINOv3 ViT-S/16
# (LVD-1689M, rotary positions, 4 storage tokens, LayerScale).
_base_ = '../_base_/mask2former-panoptic_columnar-adapter_lsj-50e_coco.py'
model = dict(
    backbone=dict(**_base_.adapter_s, backbone=_base_.dinov3_s),
    panoptic_head=dict(in_channels=[384] * 4))
