# XCiT-S24/16 on ImageNet-1k: the S12/16 recipe with stochastic depth 0.1.
# Weight decay: official XCiT main.py (timm create_optimizer): 1-D parameters, biases and cls_token
# exempt (set in xcit-s12-p16_8xb128_in1k.py).
_base_ = ['./xcit-s12-p16_8xb128_in1k.py']

model = dict(backbone=dict(arch='small_24', drop_path_rate=0.1), head=dict(in_channels=384))
