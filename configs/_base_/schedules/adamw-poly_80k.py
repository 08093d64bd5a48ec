# The Semantic FPN variant of adamw-poly_160k.py: 80k iterations (XCiT paper §4.3).
_base_ = './adamw-poly_160k.py'
max_iters = 80000
train_cfg = dict(max_iters=max_iters, val_interval=8000)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=1500, end=max_iters),
]
default_hooks = dict(checkpoint=dict(interval=8000))
