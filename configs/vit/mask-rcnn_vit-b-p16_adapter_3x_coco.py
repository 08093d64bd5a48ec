# Mask R-CNN + FPN, COCO 3x + multi-scale training, ViT-Adapter-B in ViT-Adapter's layout (DeiT
# IN-1k weights; Chen et al., ICLR 2023, Table 1): 14×14 window attention with a global block
# every third, 12 heads of deformable attention at half width, stochastic depth 0.3.
_base_ = '../_base_/mask-rcnn_columnar-adapter_3x_coco.py'
model = dict(
    backbone=dict(
        deform_num_heads=12, deform_ratio=0.5, drop_path_rate=0.3,
        backbone=dict(
            **_base_.deit_trunk, **_base_.deit_windows, arch='base', drop_path_rate=0.3,
            init_cfg=dict(
                type='Pretrained',
                checkpoint='https://dl.fbaipublicfiles.com/deit/deit_base_patch16_224-b5f2ef4d.pth'))),
    neck=dict(in_channels=[768] * 4))
