# UperNet in ViTDet's layout, ADE20k 160k, from DINOv3 ViT-B/16 (rotary positions, 4 storage
# tokens, LayerScale): ViTDet's 14×14 windows (global blocks 2, 5, 8, 11) and relative
# positions, each window rotated as a grid of its own; the class and storage tokens are left
# out. Weights: Meta's DINOv3 release (LVD-1689M), a download behind its licence form.
_base_ = './upernet_vit-b-p16_vitdet_8xb2-160k_ade20k-512x512.py'
model = dict(
    backbone=dict(
        pos_embed='none', rope='dinov3', reg_tokens=4, layer_scale=1e-5, norm_eps=1e-5,
        init_cfg=dict(checkpoint='checkpoints/dinov3_vitb16_pretrain_lvd1689m-73cec8be.pth')))
