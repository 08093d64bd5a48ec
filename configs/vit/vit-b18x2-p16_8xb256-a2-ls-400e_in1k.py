# Parallel ViT-B18x2 with LayerScale, 400 epochs ("Three things" Table 2: 84.1% top-1): A2 at
# lr 3e-3, stochastic depth 0.2 for the 36 residual blocks of a B36.
_base_ = ['./vit-s-p16_8xb256-a2_in1k.py']

model = dict(
    backbone=dict(arch='base', depth=18, num_parallel=2, layer_scale=1e-5, drop_path_rate=0.2),
    head=dict(in_channels=768))
optim_wrapper = dict(optimizer=dict(lr=3e-3))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, by_epoch=True, begin=0, end=5,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=5, end=400, T_max=395,
         convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=400)
