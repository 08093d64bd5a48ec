# UperNet, ADE20k 160k at 512×512, ViT-Adapter-T in ViT-Adapter's layout (DeiT IN-1k weights;
# Chen et al., ICLR 2023, ADE20K results): global attention, 6 heads of deformable attention,
# stochastic depth 0.1, layer-wise lr decay 0.95.
_base_ = '../_base_/upernet_columnar-adapter_160k_ade20k.py'
model = dict(
    backbone=dict(
        deform_num_heads=6, drop_path_rate=0.1,
        backbone=dict(
            **_base_.deit_trunk, arch='tiny', drop_path_rate=0.1,
            init_cfg=dict(
                type='Pretrained',
                checkpoint='https://dl.fbaipublicfiles.com/deit/deit_tiny_patch16_224-a1311bcf.pth'))),
    decode_head=dict(in_channels=[192] * 4),
    auxiliary_head=dict(in_channels=192))
optim_wrapper = dict(optimizer=dict(lr=12e-5))
