# Demo in ViTDet's layout: the small ViT of mask-rcnn_vit-d6-p8_fpn_demo-coco.py with window
# attention, relative positions and the simple feature pyramid, from scratch on the demo COCO set.
_base_ = '../_base_/demo_mask-rcnn-vitdet_coco.py'
model = dict(backbone=dict(type='vitdense.ViT', img_size=160, **_base_.demo_windows))
