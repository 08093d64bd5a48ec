# Cascade Mask R-CNN in ViTDet's layout, COCO 1024² LSJ, 100 epochs: XCiT-S12/16 as released (drop
# path 0.05) through the simple feature pyramid; XCA is linear in tokens, so every block keeps
# global attention. Layer decay 0.7.
_base_ = '../_base_/cascade-mask-rcnn_columnar-vitdet_lsj-100e_coco.py'
