# Mask R-CNN + FPN, COCO 3x, CaiT-S24 (official IN-1k weights) with the XCiT dense recipe.
_base_ = './mask-rcnn_cait-xxs24-p16_fpn_3x_coco.py'
model = dict(
    backbone=dict(
        arch='s24', drop_path_rate=0.1,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/deit/S24_224.pth')),
    neck=dict(in_channels=[384] * 4))
