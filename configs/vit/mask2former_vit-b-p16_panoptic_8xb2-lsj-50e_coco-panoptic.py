# Mask2Former panoptic, COCO panoptic, mmdet's 50-epoch LSJ recipe, ViT-B/16 (DeiT IN-1k
# weights) through the multi-layer pyramid.
_base_ = '../_base_/mask2former-panoptic_columnar_lsj-50e_coco.py'
model = dict(
    backbone=dict(
        type='vitdense.ViT', arch='base', drop_path_rate=0.1,
        init_cfg=dict(
            checkpoint='https://dl.fbaipublicfiles.com/deit/deit_base_patch16_224-b5f2ef4d.pth')),
    panoptic_head=dict(in_channels=[768] * 4))
