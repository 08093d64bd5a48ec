# Demo in ViT-Adapter's layout: the small ViT of mask-rcnn_vit-d6-p8_fpn_demo-coco.py (no class
# token in the trunk, as the official DeiT adapter) from scratch on the demo COCO set.
_base_ = '../_base_/demo_mask-rcnn-adapter_coco.py'
model = dict(backbone=dict(backbone=dict(type='vitdense.ViT', img_size=160,
                                         dense_class_token=False)))
