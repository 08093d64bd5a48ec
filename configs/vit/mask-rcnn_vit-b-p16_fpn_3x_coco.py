# Mask R-CNN + FPN, COCO 3x, ViT-B/16 (DeiT IN-1k weights) with the XCiT dense recipe.
_base_ = './mask-rcnn_vit-s-p16_fpn_3x_coco.py'
model = dict(
    backbone=dict(
        arch='base', drop_path_rate=0.1,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/deit/deit_base_patch16_224-b5f2ef4d.pth')),
    neck=dict(in_channels=[768] * 4))
