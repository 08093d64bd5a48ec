# Mask R-CNN + FPN, COCO 3x + multi-scale training, XCiT-S12/16 (official IN-1k weights) in
# ViT-Adapter's layout with the paper's ViT-Adapter-S settings (Chen et al., ICLR 2023, Table 1):
# 6 heads of deformable attention, stochastic depth 0.2, global attention (cross-covariance).
_base_ = '../_base_/mask-rcnn_columnar-adapter_3x_coco.py'
model = dict(
    backbone=dict(
        drop_path_rate=0.2,
        backbone=dict(
            type='vitdense.XCiT', arch='small_12', patch_size=16, drop_path_rate=0.2,
            norm_cfg=dict(type='SyncBN'),
            init_cfg=dict(
                type='Pretrained',
                checkpoint='https://dl.fbaipublicfiles.com/xcit/xcit_small_12_p16_384_dist.pth'))),
    neck=dict(in_channels=[384] * 4))
