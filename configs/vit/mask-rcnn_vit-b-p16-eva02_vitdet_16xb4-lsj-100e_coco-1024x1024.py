# Mask R-CNN in ViTDet's layout, COCO 1024² LSJ, 100 epochs, from EVA-02 B (Fang et al. 2023:
# rotary positions, SwiGLU with a norm, MIM-pretrained on IN-21k): ViTDet's 14×14 windows
# (global blocks 2, 5, 8, 11) and relative positions; as EVA-02's detectors, its 14-px patch
# kernels resampled to 16 px and every window's rotation rescaled to the 16×16 pretraining
# grid; the class token and its position row are left out.
_base_ = './mask-rcnn_vit-b-p16_vitdet_16xb4-lsj-100e_coco-1024x1024.py'
model = dict(
    backbone=dict(
        mlp_ratio=4 * 2 / 3, swiglu_mlp=True, scale_mlp=True, rope='eva02',
        ref_feat_shape=(16, 16), resample_patch_embed=True,
        init_cfg=dict(checkpoint='https://huggingface.co/Yuxin-CV/EVA-02/resolve/main/eva02/pt/'
                                 'eva02_B_pt_in21k_p14.pt')))
