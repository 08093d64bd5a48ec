# ViT-L/16 A2 baseline ("Three things" §2.2): lr 3e-3, stochastic depth 0.4.
_base_ = ['./vit-s-p16_8xb256-a2_in1k.py']

model = dict(backbone=dict(arch='large', drop_path_rate=0.4), head=dict(in_channels=1024))
optim_wrapper = dict(optimizer=dict(lr=3e-3))
