# UperNet, ADE20k 160k at 512×512, ConViT-S (official IN-1k weights) in ViT-Adapter's layout with
# the paper's ViT-Adapter-S settings (Chen et al., ICLR 2023, ADE20K results): 6 heads of deformable
# attention, stochastic depth 0.2, layer-wise lr decay 0.95; the class token joins the trunk after
# its ten GPSA blocks, the injectors and extractors see the patch tokens alone.
_base_ = '../_base_/upernet_columnar-adapter_160k_ade20k.py'
model = dict(
    backbone=dict(
        drop_path_rate=0.2,
        backbone=dict(
            type='vitdense.ConViT', arch='small', patch_size=16, drop_path_rate=0.2,
            init_cfg=dict(
                type='Pretrained',
                checkpoint='https://dl.fbaipublicfiles.com/convit/convit_small.pth'))),
    decode_head=dict(in_channels=[432] * 4),
    auxiliary_head=dict(in_channels=432))
