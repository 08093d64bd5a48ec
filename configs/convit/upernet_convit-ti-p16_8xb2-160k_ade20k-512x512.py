# UperNet, ADE20k 160k, ConViT-Ti (official IN-1k weights) with the XCiT dense recipe.
_base_ = '../_base_/upernet_columnar_160k_ade20k.py'
model = dict(
    backbone=dict(
        type='vitdense.ConViT', arch='tiny', drop_path_rate=0.1,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/convit/convit_tiny.pth')),
    decode_head=dict(in_channels=[192] * 4),
    auxiliary_head=dict(in_channels=192))
