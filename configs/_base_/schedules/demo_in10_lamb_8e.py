# The A2 schedule compressed for the demo set on 2 CPU cores: its LAMB, 1 warm-up epoch and a
# cosine decay over 8 epochs, lr 4e-3 as for ViT-Ti/S.
_base_ = ['./a2_lamb_300e.py']

max_epochs = 8
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, by_epoch=True, begin=0, end=1,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=1, end=max_epochs,
         T_max=max_epochs - 1, convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=max_epochs, val_interval=2)
auto_scale_lr = dict(base_batch_size=64)
