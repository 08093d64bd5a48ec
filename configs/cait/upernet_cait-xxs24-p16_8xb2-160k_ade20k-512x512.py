# UperNet, ADE20k 160k, CaiT-XXS24 (official IN-1k weights) with the XCiT dense recipe.
_base_ = '../_base_/upernet_columnar_160k_ade20k.py'
model = dict(
    backbone=dict(
        type='vitdense.CaiT', arch='xxs24', drop_path_rate=0.05,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/deit/XXS24_224.pth')),
    decode_head=dict(in_channels=[192] * 4),
    auxiliary_head=dict(in_channels=192))
