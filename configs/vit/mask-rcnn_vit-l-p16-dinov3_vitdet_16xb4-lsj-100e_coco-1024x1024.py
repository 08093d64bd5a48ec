# Mask R-CNN in ViTDet's layout, COCO 1024² LSJ, 100 epochs, from DINOv3 ViT-L/16 (rotary
# positions, 4 storage tokens, LayerScale): ViTDet-L's windows, drop path and layer decay, each
# window rotated as a grid of its own; the class and storage tokens are left out.
_base_ = '../_base_/mask-rcnn_columnar-vitdet-l_lsj-100e_coco.py'
model = dict(backbone=dict(_base_.dinov3_l, drop_path_rate=0.4))
