# Semantic FPN, ADE20k 80k, ViT-S/16 (DeiT IN-1k weights) with the XCiT dense recipe.
_base_ = '../_base_/fpn_columnar_80k_ade20k.py'
model = dict(
    backbone=dict(
        type='vitdense.ViT', arch='small', drop_path_rate=0.1,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/deit/deit_small_patch16_224-cd65a155.pth')),
    neck=dict(in_channels=[384] * 4, out_channels=384),
    decode_head=dict(in_channels=[384] * 4))
