# Cascade Mask R-CNN in ViTDet's layout, COCO 1024² LSJ, 100 epochs: ViT-B/16 with 14×14 windows
# (global blocks 2, 5, 8, 11), relative positions and the simple feature pyramid, ViTDet's drop
# path 0.1 and layer decay 0.7; from DeiT-B IN-1k weights (ViTDet starts from MAE weights, which
# load alike), the class token and its position row dropped, relative tables zero.
_base_ = '../_base_/cascade-mask-rcnn_columnar-vitdet_lsj-100e_coco.py'
model = dict(
    backbone=dict(
        type='vitdense.ViT', arch='base', drop_path_rate=0.1, **_base_.vitdet_windows_12,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/deit/deit_base_patch16_224-b5f2ef4d.pth')),
    neck=dict(in_channels=768))
