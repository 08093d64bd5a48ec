# Mask R-CNN + FPN on a columnar backbone (XCiT paper §4.2): features of four blocks, all at
# the patch stride, brought to strides 4/8/16/32 by the backbone's pyramid
# (transposed convs up, max pooling down). Default: XCiT-S12/16 as released.
_base_ = 'mmdet::_base_/models/mask-rcnn_r50_fpn.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='vitdense.XCiT',
        arch='small_12',
        patch_size=16,
        drop_path_rate=0.05,
        pyramid_norm_cfg=dict(type='SyncBN'),
        norm_cfg=dict(type='SyncBN'),  # stem / LPI BatchNorms, as the official XCiT code
        init_cfg=dict(
            type='Pretrained',
            checkpoint='https://dl.fbaipublicfiles.com/xcit/xcit_small_12_p16_384_dist.pth')),
    neck=dict(in_channels=[384, 384, 384, 384]))
