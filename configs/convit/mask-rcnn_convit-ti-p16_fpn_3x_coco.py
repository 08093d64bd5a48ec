# Mask R-CNN + FPN, COCO 3x, ConViT-Ti (official IN-1k weights) with the XCiT dense recipe.
_base_ = '../_base_/mask-rcnn_columnar_3x_coco.py'
model = dict(
    backbone=dict(
        type='vitdense.ConViT', arch='tiny', drop_path_rate=0.1,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/convit/convit_tiny.pth')),
    neck=dict(in_channels=[192] * 4))
