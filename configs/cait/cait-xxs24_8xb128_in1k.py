# CaiT-XXS24 on ImageNet-1k, DeiT recipe as in CaiT §4.3: batch 8 x 128 = 1024, AdamW lr 1e-3,
# 400 epochs, uniform stochastic depth d_r and LayerScale init from Table 3 (0.1, 1e-5 for
# XXS24; the LayerScale init comes with the arch), evaluation crop ratio 1.0.
_base_ = ['../_base_/deit_in1k_400e.py']

model = dict(
    backbone=dict(type='vitdense.CaiT', arch='xxs24', drop_path_rate=0.1),
    head=dict(in_channels=192))
