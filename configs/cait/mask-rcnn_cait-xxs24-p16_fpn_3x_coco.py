# Mask R-CNN + FPN, COCO 3x, CaiT-XXS24 (official IN-1k weights) with the XCiT dense recipe.
_base_ = '../_base_/mask-rcnn_columnar_3x_coco.py'
model = dict(
    backbone=dict(
        type='vitdense.CaiT', arch='xxs24', drop_path_rate=0.05,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/deit/XXS24_224.pth')),
    neck=dict(in_channels=[192] * 4))
