# Demo in ViTDet's layout: the small CaiT of mask-rcnn_cait-d6-p8_fpn_demo-coco.py (talking
# heads within windows) with relative positions and the simple feature pyramid, from scratch.
_base_ = '../_base_/demo_mask-rcnn-vitdet_coco.py'
model = dict(backbone=dict(type='vitdense.CaiT', img_size=160, arch=dict(layer_scale=0.1),
                           **_base_.demo_windows))
