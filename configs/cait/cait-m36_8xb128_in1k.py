# CaiT-M36 on ImageNet-1k: the XXS24 recipe with d_r 0.3 (LayerScale init 1e-6) from Table 3.
_base_ = ['./cait-xxs24_8xb128_in1k.py']

model = dict(backbone=dict(arch='m36', drop_path_rate=0.3), head=dict(in_channels=768))
