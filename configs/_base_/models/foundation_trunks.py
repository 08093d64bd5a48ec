# The foundation trunks of the Mask2Former + ViT-Adapter and LoRA recipes as variables, one per
# source and size (ViT-S/B/L, 16-pixel patches): DINOv2 (Oquab et al. 2023), DINOv3 (Siméoni
# et al. 2025) and EVA-02 (Fang et al. 2023) in the layouts of vitdense's timm table
# (`ViT.timm_models`, docs/checkpoints.md). DINOv2's and EVA-02's 14-pixel patch kernels are
# resampled to 16 pixels (timm's `resample_patch_embed`, approximate), their position tables
# sized so that they load unresampled (DINOv2: 37 x 37, EVA-02: 16 x 16); DINOv3 is 16-pixel
# already and has rotary positions alone. Each trunk keeps its class token (and registers)
# through its blocks, as pretrained. Stochastic depth: 0.2 for S, 0.3 for B and L (ViT-Adapter's
# DeiT-S / B and BEiT-L recipes). Weights: DINOv2 as timm saves `vit_*_patch14_dinov2.lvd142m`,
# DINOv3 as Meta's release (a download behind its licence form), EVA-02's masked-image-modelling
# releases (S, B: IN-21k; L: Merged-38M) from huggingface.co/Yuxin-CV/EVA-02 (eva02/pt/), each
# put at the path below: a local base lets vitdense.PeftCheckpointHook leave it out of the LoRA
# recipes' checkpoints.
_dinov2 = dict(type='vitdense.ViT', pyramid=False, patch_size=16, resample_patch_embed=True,
               img_size=592, layer_scale=1e-5)
_dinov3 = dict(type='vitdense.ViT', pyramid=False, pos_embed='none', rope='dinov3',
               reg_tokens=4, layer_scale=1e-5, norm_eps=1e-5)
_eva02 = dict(type='vitdense.ViT', pyramid=False, patch_size=16, resample_patch_embed=True,
              img_size=256, mlp_ratio=4 * 2 / 3, swiglu_mlp=True, rope='eva02',
              ref_feat_shape=(16, 16))
dinov2_s = dict(_dinov2, arch='small', drop_path_rate=0.2, init_cfg=dict(
    type='Pretrained', checkpoint='checkpoints/vit_small_patch14_dinov2.lvd142m.pth'))
dinov2_b = dict(_dinov2, arch='base', drop_path_rate=0.3, init_cfg=dict(
    type='Pretrained', checkpoint='checkpoints/vit_base_patch14_dinov2.lvd142m.pth'))
dinov2_l = dict(_dinov2, arch='large', drop_path_rate=0.3, init_cfg=dict(
    type='Pretrained', checkpoint='checkpoints/vit_large_patch14_dinov2.lvd142m.pth'))
dinov3_s = dict(_dinov3, arch='small', drop_path_rate=0.2, init_cfg=dict(
    type='Pretrained', checkpoint='checkpoints/dinov3_vits16_pretrain_lvd1689m-08c60483.pth'))
dinov3_b = dict(_dinov3, arch='base', drop_path_rate=0.3, init_cfg=dict(
    type='Pretrained', checkpoint='checkpoints/dinov3_vitb16_pretrain_lvd1689m-73cec8be.pth'))
dinov3_l = dict(_dinov3, arch='large', drop_path_rate=0.3, init_cfg=dict(
    type='Pretrained', checkpoint='checkpoints/dinov3_vitl16_pretrain_lvd1689m-8aa4cbdd.pth'))
eva02_s = dict(_eva02, arch='small', drop_path_rate=0.2, init_cfg=dict(
    type='Pretrained', checkpoint='checkpoints/eva02_S_pt_in21k_p14.pt'))
eva02_b = dict(_eva02, arch='base', scale_mlp=True, drop_path_rate=0.3, init_cfg=dict(
    type='Pretrained', checkpoint='checkpoints/eva02_B_pt_in21k_p14.pt'))
eva02_l = dict(_eva02, arch='large', scale_mlp=True, drop_path_rate=0.3, init_cfg=dict(
    type='Pretrained', checkpoint='checkpoints/eva02_L_pt_m38m_p14.pt'))
#: ViT-Adapter's deformable attention per trunk width (its DeiT-S / B and BEiT-L recipes):
#: heads, value width share, and the adapter's stochastic depth (the trunk's)
adapter_s = dict(deform_num_heads=6, drop_path_rate=0.2)
adapter_b = dict(deform_num_heads=12, deform_ratio=0.5, drop_path_rate=0.3)
adapter_l = dict(deform_num_heads=16, deform_ratio=0.5, drop_path_rate=0.3)
#: LoRA of the large LoRA recipes (docs/peft.md): rank 16, alpha 32, on every block's qkv,
#: output projection and FFN layers (SwiGLU's included)
lora_r16 = dict(type='LoRA', r=16, alpha=32, targets=('qkv', 'proj', 'fc1', 'fc2'))
