# The DeiT recipe as CaiT (§4.3) and XCiT (§4.1) train on ImageNet-1k: batch 8 x 128, AdamW
# over 400 epochs, evaluation crop ratio 1.0, mmpretrain's runtime. A leaf states its backbone
# and head width.
_base_ = [
    './models/deit_cls_in1k.py',
    './datasets/imagenet_bs128_deit_224_crop1.py',
    './schedules/deit_adamw_400e.py',
    './default_runtime_mmpretrain.py',
]
