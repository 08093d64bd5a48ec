# ConViT-B on ImageNet-1k: the ConViT-S recipe (DeiT hyper-parameters unchanged).
_base_ = ['./convit-s_8xb128_in1k.py']

model = dict(backbone=dict(arch='base'), head=dict(in_channels=768))
