# ViT-S/16 fine-tuned at 384x384 from its 224 A2 checkpoint (DeiT ↑384 procedure: 30 epochs,
# AdamW lr 5e-6 at batch 512). The 14x14 position table is resampled to 24x24 when the
# checkpoint loads; the head and BCE loss carry over from pretraining.
_base_ = [
    '../_base_/models/a2_cls_in1k-384px.py',
    '../_base_/datasets/imagenet_bs64_deit_384.py',
    '../_base_/deit_finetune_384px.py',
]

model = dict(
    backbone=dict(type='vitdense.ViT', arch='small', drop_path_rate=0.05),
    head=dict(in_channels=384),
    init_cfg=dict(checkpoint='work_dirs/vit-s-p16_8xb256-a2_in1k/epoch_300.pth'))
