# Demo: Mask R-CNN with a small CaiT (6 blocks, 128 wide, 8×8 patches, LayerScale 0.1 as the
# CaiT paper uses for shallow models) from scratch on the demo COCO set; XCiT demo heads/data.
_base_ = '../_base_/demo_mask-rcnn_coco.py'
model = dict(backbone=dict(type='vitdense.CaiT', img_size=160, arch=dict(layer_scale=0.1)))
