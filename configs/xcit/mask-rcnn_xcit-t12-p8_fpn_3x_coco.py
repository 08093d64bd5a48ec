# Mask R-CNN + FPN, COCO 3x, XCiT-T12/8: the p16 recipe with 8×8 patches.
_base_ = './mask-rcnn_xcit-t12-p16_fpn_3x_coco.py'
model = dict(
    backbone=dict(
        patch_size=8,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/xcit/xcit_tiny_12_p8_384_dist.pth')))
