# UperNet, ADE20k 160k at 512×512, ViT-Adapter-B in ViT-Adapter's layout (DeiT IN-1k weights; Chen
# et al., ICLR 2023, ADE20K results): global attention, 12 heads of deformable attention at half
# width, stochastic depth 0.3, layer-wise lr decay 0.95.
_base_ = '../_base_/upernet_columnar-adapter_160k_ade20k.py'
model = dict(
    backbone=dict(
        deform_num_heads=12, deform_ratio=0.5, drop_path_rate=0.3,
        backbone=dict(
            **_base_.deit_trunk, arch='base', drop_path_rate=0.3,
            init_cfg=dict(
                type='Pretrained',
                checkpoint='https://dl.fbaipublicfiles.com/deit/deit_base_patch16_224-b5f2ef4d.pth'))),
    decode_head=dict(in_channels=[768] * 4),
    auxiliary_head=dict(in_channels=768))
