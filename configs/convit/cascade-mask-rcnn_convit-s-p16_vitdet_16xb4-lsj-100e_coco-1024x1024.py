# Cascade Mask R-CNN in ViTDet's layout, COCO 1024² LSJ, 100 epochs: ConViT-S (official IN-1k
# weights) with GPSA and SA in 14×14 windows (global blocks 2, 5, 8, 11, as ViTDet's ViT-B; no
# class token), relative positions on the content term, the simple feature pyramid, drop path 0.1
# and layer decay 0.7.
_base_ = '../_base_/cascade-mask-rcnn_columnar-vitdet_lsj-100e_coco.py'
model = dict(
    backbone=dict(
        type='vitdense.ConViT', arch='small', drop_path_rate=0.1, **_base_.vitdet_windows_12,
        init_cfg=dict(checkpoint='https://dl.fbaipublicfiles.com/convit/convit_small.pth')),
    neck=dict(in_channels=432))
