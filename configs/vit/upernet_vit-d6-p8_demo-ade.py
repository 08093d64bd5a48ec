# Demo: UperNet with a small ViT (6 blocks, 128 wide, 8×8 patches, position table sized for
# the 128 px images) from scratch on the demo ADE20k-layout set; XCiT demo heads and data.
_base_ = '../_base_/demo_upernet_ade.py'
model = dict(backbone=dict(type='vitdense.ViT', img_size=128))
