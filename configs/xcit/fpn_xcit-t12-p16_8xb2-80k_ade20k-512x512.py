# Semantic FPN, ADE20k 80k, XCiT-T12/16 (XCiT paper Tables 5-6).
_base_ = './fpn_xcit-s12-p16_8xb2-80k_ade20k-512x512.py'
model = dict(
    backbone=dict(
        arch='tiny_12', drop_path_rate=0.0,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/xcit/xcit_tiny_12_p16_384_dist.pth')),
    neck=dict(in_channels=[192] * 4, out_channels=192),
    decode_head=dict(in_channels=[192] * 4))
