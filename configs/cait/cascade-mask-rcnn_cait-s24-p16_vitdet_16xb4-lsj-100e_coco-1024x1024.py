# Cascade Mask R-CNN in ViTDet's layout, COCO 1024² LSJ, 100 epochs: CaiT-S24 (official IN-1k
# weights) with talking heads in 14×14 windows, global attention in blocks 5, 11, 17, 23, layer
# decay 0.8 (ViTDet's values for its 24-block ViT-L; weight decay as the schedule's), drop path
# 0.1 (CaiT-S24's own), relative positions and the simple feature pyramid. 4 images of 1024² per
# GPU need 19.4 GiB under AMP, 26.9 GiB in float32 (tools/analysis_tools/memory.py): no block is
# recomputed.
_base_ = '../_base_/cascade-mask-rcnn_columnar-vitdet_lsj-100e_coco.py'
model = dict(
    backbone=dict(
        type='vitdense.CaiT', arch='s24', drop_path_rate=0.1, window_size=14,
        window_block_indexes=[i for i in range(24) if i % 6 != 5], use_rel_pos=True,
        rel_pos_img_size=1024,
        init_cfg=dict(checkpoint='https://dl.fbaipublicfiles.com/deit/S24_224.pth')),
    neck=dict(in_channels=384))
optim_wrapper = dict(paramwise_cfg=dict(layer_decay_rate=0.8))
