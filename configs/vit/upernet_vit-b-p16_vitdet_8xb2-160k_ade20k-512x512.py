# UperNet in ViTDet's layout, ADE20k 160k: ViT-B/16 (DeiT-B IN-1k weights) with 14×14 windows
# (global blocks 2, 5, 8, 11), relative positions and the simple feature pyramid; ViTDet's
# drop path 0.1 and layer decay 0.7 on the XCiT segmentation schedule.
_base_ = '../_base_/upernet_columnar-vitdet_160k_ade20k.py'
model = dict(
    backbone=dict(
        type='vitdense.ViT', arch='base', drop_path_rate=0.1, **_base_.vitdet_windows_12,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/deit/deit_base_patch16_224-b5f2ef4d.pth')),
    neck=dict(in_channels=768))
