# Demo: EoMT with a small ConViT (6 blocks, 128 wide, 8×8 patches, position table sized for the
# 128 px images) from scratch on the demo ADE20k-layout set. The queries join with the class
# token in the plain self-attention blocks after the gated positional ones, so 4 of the 6
# blocks are GPSA (ConViT: 10 of 12) to leave the 2 blocks the EoMT demos use
# (docs/eomt.md).
_base_ = '../_base_/demo_eomt_ade.py'
model = dict(backbone=dict(backbone=dict(type='vitdense.ConViT',
                                         arch=dict(num_local_layers=4))))
