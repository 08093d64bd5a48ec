# CaiT-XXS36 on ImageNet-1k: the XXS24 recipe with d_r 0.1 (LayerScale init 1e-6) from Table 3.
_base_ = ['./cait-xxs24_8xb128_in1k.py']

model = dict(backbone=dict(arch='xxs36', drop_path_rate=0.1), head=dict(in_channels=192))
