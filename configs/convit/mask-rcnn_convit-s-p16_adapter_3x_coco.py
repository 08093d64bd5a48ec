# Mask R-CNN + FPN, COCO 3x + multi-scale training, ConViT-S (official IN-1k weights) in
# ViT-Adapter's layout with the paper's ViT-Adapter-S settings (Chen et al., ICLR 2023, Table 1):
# 6 heads of deformable attention, stochastic depth 0.2, global attention; the class token joins
# the trunk after its ten GPSA blocks, the injectors and extractors see the patch tokens alone.
_base_ = '../_base_/mask-rcnn_columnar-adapter_3x_coco.py'
model = dict(
    backbone=dict(
        drop_path_rate=0.2,
        backbone=dict(
            type='vitdense.ConViT', arch='small', patch_size=16, drop_path_rate=0.2,
            init_cfg=dict(
                type='Pretrained',
                checkpoint='https://dl.fbaipublicfiles.com/convit/convit_small.pth'))),
    neck=dict(in_channels=[432] * 4))
