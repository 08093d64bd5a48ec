# Mask R-CNN + FPN, COCO 3x, XCiT-T12/16 (XCiT paper Tables 5-6).
_base_ = './mask-rcnn_xcit-s12-p16_fpn_3x_coco.py'
model = dict(
    backbone=dict(
        arch='tiny_12', drop_path_rate=0.0,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/xcit/xcit_tiny_12_p16_384_dist.pth')),
    neck=dict(in_channels=[192] * 4))
