# ViT-Ti/16 A2 baseline ("Three things" §2.2): lr 4e-3, no stochastic depth.
_base_ = ['./vit-s-p16_8xb256-a2_in1k.py']

model = dict(backbone=dict(arch='tiny', drop_path_rate=0.0), head=dict(in_channels=192))
