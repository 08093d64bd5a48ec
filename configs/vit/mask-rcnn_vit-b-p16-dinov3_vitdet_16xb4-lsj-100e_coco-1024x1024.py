# Mask R-CNN in ViTDet's layout, COCO 1024² LSJ, 100 epochs, from DINOv3 ViT-B/16 (Siméoni et
# al. 2025: rotary positions, 4 storage tokens, LayerScale): ViTDet's 14×14 windows (global
# blocks 2, 5, 8, 11) and relative positions, each window rotated as a grid of its own; the
# class and storage tokens are left out. Weights: Meta's DINOv3 release (LVD-1689M), a
# download behind its licence form, saved here under its own name; its hub file loads as is
# (the fused qkv bias with its key part masked).
_base_ = './mask-rcnn_vit-b-p16_vitdet_16xb4-lsj-100e_coco-1024x1024.py'
model = dict(
    backbone=dict(
        pos_embed='none', rope='dinov3', reg_tokens=4, layer_scale=1e-5, norm_eps=1e-5,
        init_cfg=dict(checkpoint='checkpoints/dinov3_vitb16_pretrain_lvd1689m-73cec8be.pth')))
