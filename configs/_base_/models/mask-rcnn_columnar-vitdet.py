# Mask R-CNN in ViTDet's layout (Li et al., 2022, §3-4; detectron2 projects/ViTDet): the
# backbone returns its last block's map only, ViTDet's simple feature pyramid replaces the
# FPN (strides 4-32 and RPN's stride-64 level, LayerNorm, 256 wide), a two-conv RPN, and
# RoI heads with four LayerNorm convs (box head) and LayerNorm mask convs. Inputs padded to
# 1024². Default backbone: XCiT-S12/16 as released (its XCA is linear in tokens: no windows);
# token-attention leaves add ViTDet's window attention with `vitdet_windows_12` or their own.
_base_ = ['mmdet::_base_/models/mask-rcnn_r50_fpn.py', './xcit-s12-p16_backbone.py']
# ViTDet's ViT-B setting: 14×14 windows in all blocks but 2, 5, 8, 11 (global), relative
# positions sized for the 1024² input, no class token, position table resampled as detectron2
vitdet_windows_12 = dict(window_size=14, window_block_indexes=(0, 1, 3, 4, 6, 7, 9, 10),
                         use_rel_pos=True, rel_pos_img_size=1024)
# ViTDet's ViT-L setting: the same windows, global blocks 5, 11, 17, 23
vitdet_windows_24 = dict(vitdet_windows_12,
                         window_block_indexes=tuple(i for i in range(24) if i % 6 != 5))
head_norm_cfg = dict(type='vitdense.LN2d', eps=1e-6)
model = dict(
    data_preprocessor=dict(
        pad_size_divisor=32,
        batch_augments=[dict(type='BatchFixedSizePad', size=(1024, 1024), pad_mask=True)]),
    backbone=dict(_delete_=True, **_base_.xcit_s12_p16_backbone, pyramid=False,
                  out_indices=(-1,), dense_class_token=False, pos_antialias=False),
    neck=dict(_delete_=True, type='vitdense.SimpleFeaturePyramid', in_channels=384,
              out_channels=256, scale_factors=(4.0, 2.0, 1.0, 0.5), num_outs=5,
              norm_cfg=dict(type='LN', eps=1e-6)),
    rpn_head=dict(num_convs=2),
    roi_head=dict(
        bbox_head=dict(type='Shared4Conv1FCBBoxHead', conv_out_channels=256,
                       norm_cfg=head_norm_cfg),
        mask_head=dict(norm_cfg=head_norm_cfg)))
