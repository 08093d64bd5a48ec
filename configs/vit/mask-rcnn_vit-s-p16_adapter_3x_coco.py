# Mask R-CNN + FPN, COCO 3x + multi-scale training, ViT-Adapter-S in ViT-Adapter's layout (DeiT
# IN-1k weights; Chen et al., ICLR 2023, Table 1): 14×14 window attention with a global block
# every third, 6 heads of deformable attention, stochastic depth 0.2.
_base_ = '../_base_/mask-rcnn_columnar-adapter_3x_coco.py'
model = dict(
    backbone=dict(
        deform_num_heads=6, drop_path_rate=0.2,
        backbone=dict(
            **_base_.deit_trunk, **_base_.deit_windows, arch='small', drop_path_rate=0.2,
            init_cfg=dict(
                type='Pretrained',
                checkpoint='https://dl.fbaipublicfiles.com/deit/deit_small_patch16_224-cd65a155.pth'))),
    neck=dict(in_channels=[384] * 4))
