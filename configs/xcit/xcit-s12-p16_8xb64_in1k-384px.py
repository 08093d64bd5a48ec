# XCiT-S12/16 fine-tuned at 384x384 (↑) from its 224 checkpoint. XCiT has no position table
# (Fourier features are computed for any grid), so the weights load unchanged.
_base_ = [
    '../_base_/models/deit_cls_in1k-384px.py',
    '../_base_/datasets/imagenet_bs64_deit_384_crop1.py',
    '../_base_/deit_finetune_384px.py',
]

model = dict(
    backbone=dict(type='vitdense.XCiT', arch='small_12', drop_path_rate=0.05),
    head=dict(in_channels=384),
    init_cfg=dict(checkpoint='work_dirs/xcit-s12-p16_8xb128_in1k/epoch_400.pth'))
