# Mask R-CNN for the demo COCO set on a CPU: the layers of the full recipe, heads narrowed as for
# the ResNet-18 reference of docs/benchmarks.md (FPN / RoI channels 128, 2 mask convs, 128
# sampled RoIs per image) and anchors one octave smaller for 15-70 px objects. Trained from
# scratch, so the FPN and the mask head get BN as in "Rethinking ImageNet Pre-training" (He et
# al., 2019): without it the un-normalised transformer features left the mask head at loss ln 2
# for 500 iterations. The backbone is a small XCiT unless a leaf says otherwise.
_base_ = './mask-rcnn_columnar-fpn.py'
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims=128, num_layers=6, num_heads=4), patch_size=8,
                  drop_path_rate=0.0, pyramid_norm_cfg=dict(type='BN'),
                  norm_cfg=dict(type='BN'), init_cfg=None),
    neck=dict(in_channels=[128] * 4, out_channels=128, norm_cfg=dict(type='BN')),
    rpn_head=dict(in_channels=128, feat_channels=128, anchor_generator=dict(scales=[4])),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=128),
        bbox_head=dict(in_channels=128, num_classes=3),
        mask_roi_extractor=dict(out_channels=128),
        mask_head=dict(num_convs=2, in_channels=128, conv_out_channels=128, num_classes=3,
                       norm_cfg=dict(type='BN'))),
    train_cfg=dict(rpn_proposal=dict(nms_pre=1000, max_per_img=300),
                   rcnn=dict(sampler=dict(num=128))),
    test_cfg=dict(rpn=dict(nms_pre=500, max_per_img=300), rcnn=dict(max_per_img=20)))
