# XCiT-T12/16 on ImageNet-1k: the S12/16 recipe with stochastic depth 0.0.
# Weight decay: official XCiT main.py (timm create_optimizer): 1-D parameters, biases and cls_token
# exempt (set in xcit-s12-p16_8xb128_in1k.py).
_base_ = ['./xcit-s12-p16_8xb128_in1k.py']

model = dict(backbone=dict(arch='tiny_12', drop_path_rate=0.0), head=dict(in_channels=192))
