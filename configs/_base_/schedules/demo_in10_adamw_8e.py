# The DeiT schedule compressed for the demo set on 2 CPU cores: its AdamW, 1 warm-up epoch and
# a cosine decay over 8 epochs. The lr is 1e-3 at batch 64 rather than 5e-4 x 64 / 512: a 10-minute run needs the larger steps.
_base_ = ['./deit_adamw_300e.py']

optim_wrapper = dict(optimizer=dict(lr=1e-3))
max_epochs = 8
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=1,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=1, end=max_epochs,
         T_max=max_epochs - 1, convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=max_epochs, val_interval=2)
auto_scale_lr = dict(base_batch_size=64)
