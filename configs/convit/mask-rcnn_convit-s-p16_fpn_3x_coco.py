# Mask R-CNN + FPN, COCO 3x, ConViT-S (official IN-1k weights) with the XCiT dense recipe.
_base_ = './mask-rcnn_convit-ti-p16_fpn_3x_coco.py'
model = dict(
    backbone=dict(
        arch='small', drop_path_rate=0.1,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/convit/convit_small.pth')),
    neck=dict(in_channels=[432] * 4))
