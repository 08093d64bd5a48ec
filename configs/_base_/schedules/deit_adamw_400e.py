# The DeiT schedule over the 400 epochs of CaiT (§4.3) and XCiT (§4.1): lr 1e-3 at batch 1024.
_base_ = ['./deit_adamw_300e.py']

max_epochs = 400
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=5,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=5, end=max_epochs,
         T_max=max_epochs - 5, convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=max_epochs)
