# Linear probe (DINOv2 "linear"), ADE20k 40k, frozen XCiT-S12/16 (official IN-1k weights).
_base_ = '../_base_/linear-probe_columnar_40k_ade20k.py'
model = dict(
    backbone=dict(
        _delete_=True, type='vitdense.XCiT', arch='small_12', patch_size=16, pyramid=False,
        out_indices=(-1,), norm_cfg=dict(type='SyncBN'),
        init_cfg=dict(
            type='Pretrained',
            checkpoint='https://dl.fbaipublicfiles.com/xcit/xcit_small_12_p16_384_dist.pth')),
    decode_head=dict(in_channels=[384]))
