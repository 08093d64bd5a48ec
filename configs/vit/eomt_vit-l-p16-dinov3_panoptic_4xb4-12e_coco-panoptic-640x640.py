# EoMT-L, COCO panoptic, 640×640: the official DINOv3 recipe (tue-mps/eomt configs/dinov3/coco/
# panoptic/eomt_large_640.yaml). DINOv3-L (16-px patches, 4 registers, rotary positions on the
# patches alone, LayerScale), the DINOv2 recipe's data, losses and length with the official
# DINOv3 changes: lr 2e-4, the 4 query blocks at the full rate (llrd_l2_enabled=False), warmup
# 5,000 iterations (the official: heads 2,000, then the ViT 3,000), the first block's masks
# annealed over iterations 0-3,000. Weights: Meta's DINOv3 release (a download behind its
# licence form), put at the path below; COCO panoptic under data/coco as mmdet lays it out.
_base_ = '../_base_/eomt-panoptic_12e_coco-panoptic-640x640.py'
model = dict(backbone=dict(decay_query_blocks=False, backbone=dict(
    arch='large', patch_size=16, img_size=640, pos_embed='none', rope='dinov3', reg_tokens=4,
    layer_scale=1e-5, norm_eps=1e-5,
    init_cfg=dict(type='Pretrained',
                  checkpoint='checkpoints/dinov3_vitl16_pretrain_lvd1689m-8aa4cbdd.pth'))))
custom_hooks = [
    dict(type='vitdense.EoMTMaskAnnealingHook', start_iters=[0, 29564, 44346, 59128],
         end_iters=[3000, 44346, 59128, 73910], power=0.9)
]
warmup_iters = 5000
optim_wrapper = dict(optimizer=dict(lr=2e-4))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=warmup_iters),
    dict(type='PolyLR', eta_min=0.0, power=0.9, by_epoch=False, begin=warmup_iters,
         end={{_base_.max_iters}}),
]
