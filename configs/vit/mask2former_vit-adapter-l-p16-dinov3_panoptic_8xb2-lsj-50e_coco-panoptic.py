# Mask2Former panoptic, COCO panoptic 50 epochs LSJ, ViT-Adapter-L around DINOv3 ViT-L/16
# (LVD-1689M, rotary positions, 4 storage tokens, LayerScale).
# the adapter and trunk recomputed in backward (`with_cp`, as ViT-Adapter's large recipes), so
# that 2 images per GPU fit 32 GB in float32
_base_ = '../_base_/mask2former-panoptic_columnar-adapter_lsj-50e_coco.py'
model = dict(
    backbone=dict(**_base_.adapter_l, with_cp=True,
                  backbone=dict(**_base_.dinov3_l, with_cp=True)),
    panoptic_head=dict(in_channels=[1024] * 4))
