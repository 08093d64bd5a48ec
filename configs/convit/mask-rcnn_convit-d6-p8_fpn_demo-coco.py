# Demo: Mask R-CNN with a small ConViT (6 blocks, 5 of them GPSA as 10 of 12 in ConViT, 128
# wide, 8×8 patches) from scratch on the demo COCO set; same heads and data as the XCiT demo.
_base_ = '../_base_/demo_mask-rcnn_coco.py'
model = dict(backbone=dict(type='vitdense.ConViT', img_size=160, arch=dict(num_local_layers=5)))
