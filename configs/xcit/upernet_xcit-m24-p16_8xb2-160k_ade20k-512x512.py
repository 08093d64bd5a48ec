# UperNet, ADE20k 160k, XCiT-M24/16 (XCiT paper Tables 5-6).
_base_ = './upernet_xcit-s12-p16_8xb2-160k_ade20k-512x512.py'
model = dict(
    backbone=dict(
        arch='medium_24', drop_path_rate=0.15,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/xcit/xcit_medium_24_p16_384_dist.pth')),
    decode_head=dict(in_channels=[512] * 4),
    auxiliary_head=dict(in_channels=512))
