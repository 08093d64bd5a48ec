# Semantic FPN on a columnar backbone (XCiT paper §4.3). As in the official XCiT code the
# FPN keeps the backbone width (out_channels = embed_dims). Default: XCiT-S12/16 as released.
_base_ = 'mmseg::_base_/models/fpn_r50.py'
model = dict(
    pretrained=None,
    data_preprocessor=dict(size=(512, 512)),  # pads smaller crops
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
    neck=dict(in_channels=[384, 384, 384, 384], out_channels=384),
    decode_head=dict(in_channels=[384, 384, 384, 384], num_classes=150))
