# DINOv2's linear probe (Oquab et al. 2023, §7.3) on a frozen columnar backbone: BatchNorm and
# a 1×1 conv over the last block's patch tokens (stride 16), the backbone in eval mode without
# gradients (vitdense.FrozenBackboneSegmentor), 512² sliding windows at stride 341 as DINOv2
# evaluates. Default backbone: XCiT-S12/16 as released; family leaves replace it.
# DINOv2's head with the class token (ViT; ConViT's blocks past its GPSA blocks):
# model.backbone.output_cls_token=True and model.decode_head.use_cls_token=True.
_base_ = './xcit-s12-p16_backbone.py'
model = dict(
    type='vitdense.FrozenBackboneSegmentor',
    data_preprocessor=dict(type='SegDataPreProcessor', mean=[123.675, 116.28, 103.53],
                           std=[58.395, 57.12, 57.375], bgr_to_rgb=True, pad_val=0,
                           seg_pad_val=255, size=(512, 512)),
    backbone=dict(**_base_.xcit_s12_p16_backbone, pyramid=False, out_indices=(-1,)),
    decode_head=dict(
        type='vitdense.LinearProbeHead', in_channels=[384], in_index=[0], use_cls_token=False,
        num_classes=150,
        dropout_ratio=0.0, norm_cfg=dict(type='SyncBN', requires_grad=True),
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)),
    train_cfg=dict(),
    test_cfg=dict(mode='slide', crop_size=(512, 512), stride=(341, 341)))
