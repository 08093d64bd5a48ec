# Demo in ViTDet's layout: the small ConViT of mask-rcnn_convit-d6-p8_fpn_demo-coco.py (GPSA and
# SA within windows, no class token) with relative positions and the simple feature pyramid.
_base_ = '../_base_/demo_mask-rcnn-vitdet_coco.py'
model = dict(backbone=dict(type='vitdense.ConViT', img_size=160, arch=dict(num_local_layers=5),
                           **_base_.demo_windows))
