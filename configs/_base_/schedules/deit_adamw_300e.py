# DeiT schedule (Touvron et al. 2021), shared by ConViT: AdamW, lr 5e-4 x batch / 512 (1e-3 for
# the 8x128 = 1024 batch here; --auto-scale-lr rescales to the actual batch), weight decay 0.05
# except on norms, biases, LayerScale / gating vectors, position embeddings and class tokens,
# 5 linear warm-up epochs from 1e-6 and a cosine decay to 1e-5 over 300 epochs.
_base_ = ['./deit_weight_decay.py']

optim_wrapper = dict(
    optimizer=dict(type='AdamW', lr=5e-4 * 1024 / 512, weight_decay=0.05, eps=1e-8,
                   betas=(0.9, 0.999)),
    paramwise_cfg=dict(custom_keys={'.temperature': dict(decay_mult=0.0)}),
)

max_epochs = 300
warmup_epochs = 5
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=warmup_epochs,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=warmup_epochs,
         end=max_epochs, T_max=max_epochs - warmup_epochs, convert_to_iter_based=True),
]

train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=1)
val_cfg = dict()
test_cfg = dict()

auto_scale_lr = dict(base_batch_size=1024)
