# UperNet + auxiliary FCN head on a columnar backbone (XCiT paper §4.3): the backbone's
# pyramid gives strides 4/8/16/32; the auxiliary head reads the stride-16 level.
# Default: XCiT-S12/16 as released.
_base_ = 'mmseg::_base_/models/upernet_r50.py'
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
    decode_head=dict(in_channels=[384, 384, 384, 384], num_classes=150),
    auxiliary_head=dict(in_channels=384, num_classes=150))
