# UperNet, ADE20k 160k, ViT-B/16 (DeiT IN-1k weights) with the XCiT dense recipe.
_base_ = './upernet_vit-s-p16_8xb2-160k_ade20k-512x512.py'
model = dict(
    backbone=dict(
        arch='base', drop_path_rate=0.1,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/deit/deit_base_patch16_224-b5f2ef4d.pth')),
    decode_head=dict(in_channels=[768] * 4),
    auxiliary_head=dict(in_channels=768))
