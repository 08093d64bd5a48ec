# Demo in ViT-Adapter's layout: the small ConViT of mask-rcnn_convit-d6-p8_fpn_demo-coco.py (5
# GPSA blocks; the class token joins before the last block, the family's rule, and the
# adapter's injectors and extractors see the patch tokens alone) on the demo COCO set.
_base_ = '../_base_/demo_mask-rcnn-adapter_coco.py'
model = dict(backbone=dict(backbone=dict(type='vitdense.ConViT', img_size=160,
                                         arch=dict(num_local_layers=5))))
