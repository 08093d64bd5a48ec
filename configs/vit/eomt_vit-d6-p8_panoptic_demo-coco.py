# Demo: EoMT panoptic segmentation with a small ViT (6 blocks, 128 wide, 8×8 patches, position
# table sized for the 128 px images) from scratch on the demo COCO panoptic set.
_base_ = '../_base_/demo_eomt-panoptic_coco.py'
