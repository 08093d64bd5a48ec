# Linear probe (DINOv2 "linear"), ADE20k 40k, frozen ViT-S/16 (DeiT IN-1k weights).
_base_ = '../_base_/linear-probe_columnar_40k_ade20k.py'
model = dict(
    backbone=dict(
        _delete_=True, type='vitdense.ViT', arch='small', patch_size=16, pyramid=False,
        out_indices=(-1,), norm_cfg=dict(type='SyncBN'),
        init_cfg=dict(
            type='Pretrained',
            checkpoint='https://dl.fbaipublicfiles.com/deit/deit_small_patch16_224-cd65a155.pth')),
    decode_head=dict(in_channels=[384]))
