# EoMT-L, COCO panoptic, 640×640: the official DINOv2 recipe (tue-mps/eomt configs/dinov2/coco/
# panoptic/eomt_large_640.yaml). DINOv2-L with 4 registers, its 14-px patch projection
# resampled to 16 px as the official ViT builds it and its position table to the 40×40 grid.
# Weights: timm's vit_large_patch14_reg4_dinov2 (DINOv2's release), put at the path below;
# COCO panoptic under data/coco as mmdet lays it out.
_base_ = '../_base_/eomt-panoptic_12e_coco-panoptic-640x640.py'
model = dict(backbone=dict(backbone=dict(
    arch='large', patch_size=16, img_size=640, reg_tokens=4, no_embed_class=True,
    layer_scale=1e-5, resample_patch_embed=True,
    init_cfg=dict(type='Pretrained',
                  checkpoint='checkpoints/vit_large_patch14_reg4_dinov2.lvd142m.pth'))))
