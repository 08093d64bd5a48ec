# Demo: Mask R-CNN with a small ViT (6 blocks, 128 wide, 8×8 patches, position table sized for
# the 160 px images) from scratch on the demo COCO set; same heads and data as the XCiT demo.
_base_ = '../_base_/demo_mask-rcnn_coco.py'
model = dict(backbone=dict(type='vitdense.ViT', img_size=160))
