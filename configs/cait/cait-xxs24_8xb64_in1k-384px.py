# CaiT-XXS24 fine-tuned at 384x384 (↑384, CaiT §4.3) from its 224 checkpoint: DeiT fine-tuning
# procedure, position table resampled by the backbone's load hook, evaluation crop ratio 1.0.
# Weight decay: DeiT fine-tuning, 1e-8 (_base_/schedules/deit_finetune_adamw_30e.py).
_base_ = [
    '../_base_/models/deit_cls_in1k.py',
    '../_base_/datasets/imagenet_bs64_deit_384_crop1.py',
    '../_base_/schedules/deit_finetune_adamw_30e.py',
    'mmpretrain::_base_/default_runtime.py',
]

model = dict(
    backbone=dict(type='vitdense.CaiT', arch='xxs24', img_size=384, drop_path_rate=0.1),
    head=dict(in_channels=192),
    init_cfg=dict(type='Pretrained',
                  checkpoint='work_dirs/cait-xxs24_8xb128_in1k/epoch_400.pth'))
