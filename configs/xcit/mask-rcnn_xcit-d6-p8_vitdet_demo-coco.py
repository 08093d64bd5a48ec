# Demo in ViTDet's layout: the small XCiT of mask-rcnn_xcit-d6-p8_fpn_demo-coco.py through the
# simple feature pyramid (XCA is linear in tokens: no windows), from scratch on the demo COCO set.
_base_ = '../_base_/demo_mask-rcnn-vitdet_coco.py'
