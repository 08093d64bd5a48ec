# UperNet + auxiliary FCN head on a columnar backbone in ViTDet's layout: the backbone returns
# its last block's map, ViTDet's simple feature pyramid (LayerNorm, 256 wide) makes strides
# 4/8/16/32 for the UperNet head; the auxiliary head reads the stride-16 level. Default
# backbone: XCiT-S12/16 as released (no windows); token-attention leaves add window attention
# with `vitdet_windows_12` or their own.
_base_ = ['mmseg::_base_/models/upernet_r50.py', './xcit-s12-p16_backbone.py']
# ViTDet's ViT-B windows (global blocks 2, 5, 8, 11), relative positions for 512² crops
vitdet_windows_12 = dict(window_size=14, window_block_indexes=(0, 1, 3, 4, 6, 7, 9, 10),
                         use_rel_pos=True, rel_pos_img_size=512)
model = dict(
    pretrained=None,
    data_preprocessor=dict(size=(512, 512)),  # pads smaller crops
    backbone=dict(_delete_=True, **_base_.xcit_s12_p16_backbone, pyramid=False,
                  out_indices=(-1,), dense_class_token=False, pos_antialias=False),
    neck=dict(type='vitdense.SimpleFeaturePyramid', in_channels=384, out_channels=256,
              scale_factors=(4.0, 2.0, 1.0, 0.5), num_outs=4,
              norm_cfg=dict(type='LN', eps=1e-6)),
    decode_head=dict(in_channels=[256] * 4, num_classes=150),
    auxiliary_head=dict(in_channels=256, num_classes=150))
