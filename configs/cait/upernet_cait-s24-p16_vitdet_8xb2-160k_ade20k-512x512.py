# UperNet in ViTDet's layout, ADE20k 160k: CaiT-S24 (official IN-1k weights) with talking heads
# in 14×14 windows, global blocks 5, 11, 17, 23 and layer decay 0.8 (ViTDet's 24-block values;
# weight decay as the schedule's),
# drop path 0.1, relative positions and the simple feature pyramid.
_base_ = '../_base_/upernet_columnar-vitdet_160k_ade20k.py'
model = dict(
    backbone=dict(
        type='vitdense.CaiT', arch='s24', drop_path_rate=0.1, window_size=14,
        window_block_indexes=[i for i in range(24) if i % 6 != 5], use_rel_pos=True,
        rel_pos_img_size=512,
        init_cfg=dict(checkpoint='https://dl.fbaipublicfiles.com/deit/S24_224.pth')),
    neck=dict(in_channels=384))
optim_wrapper = dict(paramwise_cfg=dict(layer_decay_rate=0.8))
