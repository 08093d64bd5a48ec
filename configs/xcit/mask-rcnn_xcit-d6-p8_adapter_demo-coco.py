# Demo in ViT-Adapter's layout: the small XCiT of mask-rcnn_xcit-d6-p8_fpn_demo-coco.py from
# scratch on the demo COCO set.
_base_ = '../_base_/demo_mask-rcnn-adapter_coco.py'
model = dict(backbone=dict(backbone=dict(type='vitdense.XCiT')))
