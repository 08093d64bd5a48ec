# Mask R-CNN in ViTDet's layout, COCO 1024² LSJ, 100 epochs, from EVA-02 L (rotary positions,
# SwiGLU with a norm, MIM-pretrained on Merged-38M): ViTDet-L's windows, drop path and layer
# decay; its 14-px patch kernels resampled to 16 px and every window's rotation rescaled to the
# 16×16 pretraining grid; the class token and its position row are left out.
_base_ = '../_base_/mask-rcnn_columnar-vitdet-l_lsj-100e_coco.py'
model = dict(backbone=dict(_base_.eva02_l, drop_path_rate=0.4))
