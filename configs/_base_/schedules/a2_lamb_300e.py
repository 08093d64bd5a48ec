# A2 schedule of Wightman et al. as adapted to ViT in "Three things everyone should know about
# ViTs" (§2.2): LAMB, lr 4e-3 for ViT-Ti/S (3e-3 for B/L, set in their configs) at batch
# 2048, weight decay 0.02 except on norms, biases and embeddings, 5 warm-up epochs and a cosine
# decay over 300 epochs.
_base_ = ['./deit_weight_decay.py']

optim_wrapper = dict(optimizer=dict(type='Lamb', lr=4e-3, weight_decay=0.02))

max_epochs = 300
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, by_epoch=True, begin=0, end=5,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-6, by_epoch=True, begin=5, end=max_epochs,
         T_max=max_epochs - 5, convert_to_iter_based=True),
]

train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=1)
val_cfg = dict()
test_cfg = dict()

auto_scale_lr = dict(base_batch_size=2048)
