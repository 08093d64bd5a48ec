# UperNet, ADE20k 160k, CaiT-S24 (official IN-1k weights) with the XCiT dense recipe.
_base_ = './upernet_cait-xxs24-p16_8xb2-160k_ade20k-512x512.py'
model = dict(
    backbone=dict(
        arch='s24', drop_path_rate=0.1,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/deit/S24_224.pth')),
    decode_head=dict(in_channels=[384] * 4),
    auxiliary_head=dict(in_channels=384))
