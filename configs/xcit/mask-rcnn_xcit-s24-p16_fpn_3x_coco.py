# Mask R-CNN + FPN, COCO 3x, XCiT-S24/16 (XCiT paper Tables 5-6).
_base_ = './mask-rcnn_xcit-s12-p16_fpn_3x_coco.py'
model = dict(
    backbone=dict(
        arch='small_24', drop_path_rate=0.1,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/xcit/xcit_small_24_p16_384_dist.pth')),
    neck=dict(in_channels=[384] * 4))
