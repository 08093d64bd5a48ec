# Demo recipe in ViTDet's layout: the demo Mask R-CNN (same heads, data, schedule) with the
# backbone's last block through the simple feature pyramid (8×8 patches: strides 4-32 by
# scales 2, 1, 1/2, 1/4, and the stride-64 level) instead of the multi-layer pyramid + FPN.
# Token-attention leaves add `demo_windows`: 5×5 windows on the 20×20 grid of the 160 px
# images, global attention in blocks 2 and 5 of 6, relative positions.
_base_ = './demo_mask-rcnn_coco.py'
demo_windows = dict(window_size=5, window_block_indexes=(0, 1, 3, 4), use_rel_pos=True,
                    rel_pos_img_size=160)
model = dict(
    backbone=dict(pyramid=False, out_indices=(-1,), dense_class_token=False,
                  pos_antialias=False),
    neck=dict(_delete_=True, type='vitdense.SimpleFeaturePyramid', in_channels=128,
              out_channels=128, scale_factors=(2.0, 1.0, 0.5, 0.25), num_outs=5,
              norm_cfg=dict(type='LN', eps=1e-6)))
