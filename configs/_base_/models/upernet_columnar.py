# UperNet + auxiliary FCN head on a columnar backbone (XCiT paper §4.3): the backbone's
# pyramid gives strides 4/8/16/32; the auxiliary head reads the stride-16 level.
# Default: XCiT-S12/16 as released.
_base_ = ['mmseg::_base_/models/upernet_r50.py', './xcit-s12-p16_backbone.py']
model = dict(
    pretrained=None,
    data_preprocessor=dict(size=(512, 512)),  # pads smaller crops
    backbone=dict(_delete_=True, **_base_.xcit_s12_p16_backbone),
    decode_head=dict(in_channels=[384, 384, 384, 384], num_classes=150),
    auxiliary_head=dict(in_channels=384, num_classes=150))
