# Demo: UperNet with a small CaiT (6 blocks, 128 wide, 8×8 patches, LayerScale 0.1 as the CaiT
# paper uses for shallow models) from scratch on the demo ADE20k-layout set.
_base_ = '../_base_/demo_upernet_ade.py'
model = dict(backbone=dict(type='vitdense.CaiT', img_size=128, arch=dict(layer_scale=0.1)))
