# Semantic FPN, ADE20k 80k, XCiT-M24/8: the p16 recipe with 8×8 patches.
_base_ = './fpn_xcit-m24-p16_8xb2-80k_ade20k-512x512.py'
model = dict(
    backbone=dict(
        patch_size=8,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/xcit/xcit_medium_24_p8_384_dist.pth')))
