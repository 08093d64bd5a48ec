# UperNet, ADE20k 160k, ConViT-B (official IN-1k weights) with the XCiT dense recipe.
_base_ = './upernet_convit-ti-p16_8xb2-160k_ade20k-512x512.py'
model = dict(
    backbone=dict(
        arch='base', drop_path_rate=0.1,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/convit/convit_base.pth')),
    decode_head=dict(in_channels=[768] * 4),
    auxiliary_head=dict(in_channels=768))
