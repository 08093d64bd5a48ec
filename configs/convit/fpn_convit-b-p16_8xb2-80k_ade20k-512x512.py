# Semantic FPN, ADE20k 80k, ConViT-B (official IN-1k weights) with the XCiT dense recipe.
_base_ = './fpn_convit-ti-p16_8xb2-80k_ade20k-512x512.py'
model = dict(
    backbone=dict(
        arch='base', drop_path_rate=0.1,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/convit/convit_base.pth')),
    neck=dict(in_channels=[768] * 4, out_channels=768),
    decode_head=dict(in_channels=[768] * 4))
