# Semantic FPN, ADE20k 80k, XCiT-S12/8: the p16 recipe with 8×8 patches.
# Weight decay: the official XCiT dense rule, only the LayerNorms exempt
# (weight_decay_rule='custom_keys', custom_keys 'norm'; _base_/schedules/adamw-poly_80k.py).
_base_ = './fpn_xcit-s12-p16_8xb2-80k_ade20k-512x512.py'
model = dict(
    backbone=dict(
        patch_size=8,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/xcit/xcit_small_12_p8_384_dist.pth')))
