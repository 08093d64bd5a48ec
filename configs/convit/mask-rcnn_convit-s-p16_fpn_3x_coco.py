# Mask R-CNN + FPN, COCO 3x, ConViT-S (official IN-1k weights) with the XCiT dense recipe.
# Weight decay: the official XCiT dense rule, only the LayerNorms exempt
# (weight_decay_rule='custom_keys', custom_keys 'norm'; _base_/schedules/adamw_3x.py).
_base_ = './mask-rcnn_convit-ti-p16_fpn_3x_coco.py'
model = dict(
    backbone=dict(
        arch='small', drop_path_rate=0.1,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/convit/convit_small.pth')),
    neck=dict(in_channels=[432] * 4))
