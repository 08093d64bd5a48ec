# Demo: UperNet with a small ConViT (6 blocks, 5 of them GPSA as 10 of 12 in ConViT, 128 wide,
# 8×8 patches) from scratch on the demo ADE20k-layout set; XCiT demo heads and data.
_base_ = '../_base_/demo_upernet_ade.py'
model = dict(backbone=dict(type='vitdense.ConViT', img_size=128, arch=dict(num_local_layers=5)))
