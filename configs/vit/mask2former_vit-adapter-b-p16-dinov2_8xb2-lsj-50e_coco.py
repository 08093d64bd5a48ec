# Mask2Former instance, COCO 50 epochs LSJ, ViT-Adapter-B around DINOv2 ViT-B/16
# (LVD-142M, LayerScale, 14-px patch kernels resampled to 16 px).
_base_ = '../_base_/mask2former_columnar-adapter_lsj-50e_coco.py'
model = dict(
    backbone=dict(**_base_.adapter_b, backbone=_base_.dinov2_b),
    panoptic_head=dict(in_channels=[768] * 4))
