# Semantic FPN on a columnar backbone (XCiT paper §4.3). As in the official XCiT code the
# FPN keeps the backbone width (out_channels = embed_dims). Default: XCiT-S12/16 as released.
_base_ = ['mmseg::_base_/models/fpn_r50.py', './xcit-s12-p16_backbone.py']
model = dict(
    pretrained=None,
    data_preprocessor=dict(size=(512, 512)),  # pads smaller crops
    backbone=dict(_delete_=True, **_base_.xcit_s12_p16_backbone),
    neck=dict(in_channels=[384, 384, 384, 384], out_channels=384),
    decode_head=dict(in_channels=[384, 384, 384, 384], num_classes=150))
