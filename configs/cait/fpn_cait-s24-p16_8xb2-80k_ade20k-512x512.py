# Semantic FPN, ADE20k 80k, CaiT-S24 (official IN-1k weights) with the XCiT dense recipe.
_base_ = './fpn_cait-xxs24-p16_8xb2-80k_ade20k-512x512.py'
model = dict(
    backbone=dict(
        arch='s24', drop_path_rate=0.1,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/deit/S24_224.pth')),
    neck=dict(in_channels=[384] * 4, out_channels=384),
    decode_head=dict(in_channels=[384] * 4))
