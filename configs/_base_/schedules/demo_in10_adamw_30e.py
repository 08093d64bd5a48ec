# The DeiT schedule compressed for the demo set on 2 CPU cores: AdamW with weight decay 0.05
# (none on norms, biases, embeddings), 2 warm-up epochs and a cosine decay over 30 epochs. The
# lr is 1e-3 at batch 64 rather than 5e-4 x 64 / 512: a 10-minute run needs the larger steps.
_base_ = ['./deit_adamw_300e.py']

optim_wrapper = dict(optimizer=dict(lr=1e-3))
max_epochs = 30
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=2,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=2, end=max_epochs,
         T_max=max_epochs - 2, convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=max_epochs, val_interval=5)
auto_scale_lr = dict(base_batch_size=64)
