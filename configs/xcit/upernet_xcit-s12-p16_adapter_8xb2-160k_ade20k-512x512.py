# UperNet, ADE20k 160k at 512×512, XCiT-S12/16 (official IN-1k weights) in ViT-Adapter's layout
# with the paper's ViT-Adapter-S settings (Chen et al., ICLR 2023, ADE20K results): 6 heads of
# deformable attention, stochastic depth 0.2, layer-wise lr decay 0.95 (cross-covariance).
_base_ = '../_base_/upernet_columnar-adapter_160k_ade20k.py'
model = dict(
    backbone=dict(
        drop_path_rate=0.2,
        backbone=dict(
            type='vitdense.XCiT', arch='small_12', patch_size=16, drop_path_rate=0.2,
            norm_cfg=dict(type='SyncBN'),
            init_cfg=dict(
                type='Pretrained',
                checkpoint='https://dl.fbaipublicfiles.com/xcit/xcit_small_12_p16_384_dist.pth'))),
    decode_head=dict(in_channels=[384] * 4),
    auxiliary_head=dict(in_channels=384))
