# Mask R-CNN + FPN on a columnar backbone (XCiT paper §4.2): features of four blocks, all at
# the patch stride, brought to strides 4/8/16/32 by the backbone's pyramid
# (transposed convs up, max pooling down). Default: XCiT-S12/16 as released.
_base_ = ['mmdet::_base_/models/mask-rcnn_r50_fpn.py', './xcit-s12-p16_backbone.py']
model = dict(
    backbone=dict(_delete_=True, **_base_.xcit_s12_p16_backbone),
    neck=dict(in_channels=[384, 384, 384, 384]))
