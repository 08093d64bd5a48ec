# XCiT-M24/16 on ImageNet-1k: the S12/16 recipe with stochastic depth 0.15.
_base_ = ['./xcit-s12-p16_8xb128_in1k.py']

model = dict(backbone=dict(arch='medium_24', drop_path_rate=0.15), head=dict(in_channels=512))
