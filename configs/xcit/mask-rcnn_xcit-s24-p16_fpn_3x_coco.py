# Mask R-CNN + FPN, COCO 3x, XCiT-S24/16 (XCiT paper Tables 5-6).
# Weight decay: the official XCiT dense rule, only the LayerNorms exempt
# (weight_decay_rule='custom_keys', custom_keys 'norm'; _base_/schedules/adamw_3x.py).
_base_ = './mask-rcnn_xcit-s12-p16_fpn_3x_coco.py'
model = dict(
    backbone=dict(
        arch='small_24', drop_path_rate=0.1,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/xcit/xcit_small_24_p16_384_dist.pth')),
    neck=dict(in_channels=[384] * 4))
