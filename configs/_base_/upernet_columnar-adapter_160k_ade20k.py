# Recipe: UperNet on a columnar backbone in ViT-Adapter's layout, ADE20k 160k iterations at
# 512×512 (Chen et al., ICLR 2023, ADE20K results; the official
# upernet_deit_adapter_*_512_160k_ade20k.py): AdamW lr 6e-5 (12e-5 for the tiny trunk),
# weight decay 0.01 at batch 16, layer-wise lr decay 0.95 over the trunk's blocks (the adapter
# at the full rate), one-dimensional parameters without weight decay, 1500-iteration warmup
# then poly decay. As the official segmentation code, the trunk's map after interaction i is
# added to level i (`vit_features='per_interaction'`), and images (short side 512) are
# evaluated in 512² sliding windows at stride 341. Family leaves set the trunk, its checkpoint
# and the heads' widths.
_base_ = ['./upernet_columnar_160k_ade20k.py', './models/vit-adapter.py']
model = dict(
    backbone=dict(_base_.vit_adapter, _delete_=True, vit_features='per_interaction'),
    decode_head=dict(in_channels=[384] * 4),
    auxiliary_head=dict(in_channels=384),
    test_cfg=dict(mode='slide', crop_size=(512, 512), stride=(341, 341)))
optim_wrapper = dict(
    optimizer=dict(lr=6e-5),
    paramwise_cfg=dict(_delete_=True, weight_decay_rule='timm', layer_decay_rate=0.95))
