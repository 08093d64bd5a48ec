# Semantic FPN, ADE20k 80k, ConViT-S (official IN-1k weights) with the XCiT dense recipe.
_base_ = './fpn_convit-ti-p16_8xb2-80k_ade20k-512x512.py'
model = dict(
    backbone=dict(
        arch='small', drop_path_rate=0.1,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/convit/convit_small.pth')),
    neck=dict(in_channels=[432] * 4, out_channels=432),
    decode_head=dict(in_channels=[432] * 4))
