# Demo: EoMT instance segmentation with a small ViT (6 blocks, 128 wide, 8×8 patches, position
# table sized for the 160 px images) from scratch on the demo COCO set.
_base_ = '../_base_/demo_eomt_coco.py'
