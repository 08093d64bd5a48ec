# UperNet, ADE20k 160k, XCiT-T12/8: the p16 recipe with 8×8 patches.
_base_ = './upernet_xcit-t12-p16_8xb2-160k_ade20k-512x512.py'
model = dict(
    backbone=dict(
        patch_size=8,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/xcit/xcit_tiny_12_p8_384_dist.pth')))
