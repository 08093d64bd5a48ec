# Demo: Mask2Former panoptic with a small ViT (6 blocks, 128 wide, 8×8 patches, position
# table sized for the 128 px images) from scratch on the demo COCO panoptic set.
_base_ = '../_base_/demo_mask2former-panoptic_coco.py'
model = dict(backbone=dict(type='vitdense.ViT', img_size=128))
