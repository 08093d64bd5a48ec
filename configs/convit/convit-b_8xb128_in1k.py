# ConViT-B on ImageNet-1k: the ConViT-S recipe (DeiT hyper-parameters unchanged).
# Weight decay: official ConViT main.py (timm create_optimizer): 1-D parameters, biases, pos_embed
# and cls_token exempt (_base_/schedules/deit_adamw_*.py).
_base_ = ['./convit-s_8xb128_in1k.py']

model = dict(backbone=dict(arch='base'), head=dict(in_channels=768))
