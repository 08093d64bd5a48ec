# Demo recipe in ViTDet's layout: the demo UperNet (same heads, data, schedule) on the
# backbone's last block through the simple feature pyramid (8×8 patches: strides 4-32 by
# scales 2, 1, 1/2, 1/4) instead of the multi-layer pyramid. Token-attention leaves add
# `demo_windows`: 4×4 windows on the 16×16 grid of the 128 px images, global attention in
# blocks 2 and 5 of 6, relative positions.
_base_ = './demo_upernet_ade.py'
demo_windows = dict(window_size=4, window_block_indexes=(0, 1, 3, 4), use_rel_pos=True,
                    rel_pos_img_size=128)
model = dict(
    backbone=dict(pyramid=False, out_indices=(-1,), dense_class_token=False,
                  pos_antialias=False),
    neck=dict(type='vitdense.SimpleFeaturePyramid', in_channels=128, out_channels=128,
              scale_factors=(2.0, 1.0, 0.5, 0.25), num_outs=4,
              norm_cfg=dict(type='LN', eps=1e-6)))
