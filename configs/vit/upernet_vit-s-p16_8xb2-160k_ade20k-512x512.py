# UperNet, ADE20k 160k, ViT-S/16 (DeiT IN-1k weights) with the XCiT dense recipe.
_base_ = '../_base_/upernet_columnar_160k_ade20k.py'
model = dict(
    backbone=dict(
        type='vitdense.ViT', arch='small', drop_path_rate=0.1,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/deit/deit_small_patch16_224-cd65a155.pth')),
    decode_head=dict(in_channels=[384] * 4),
    auxiliary_head=dict(in_channels=384))
