# Linear probe (DINOv2 "linear"), ADE20k 40k, frozen CaiT-XXS24 (official IN-1k weights).
_base_ = '../_base_/linear-probe_columnar_40k_ade20k.py'
model = dict(
    backbone=dict(
        _delete_=True, type='vitdense.CaiT', arch='xxs24', patch_size=16, pyramid=False,
        out_indices=(-1,), norm_cfg=dict(type='SyncBN'),
        init_cfg=dict(
            type='Pretrained',
            checkpoint='https://dl.fbaipublicfiles.com/deit/XXS24_224.pth')),
    decode_head=dict(in_channels=[192]))
