# Recipe: DINOv2's linear probe of a frozen columnar backbone, ADE20k 512² crops, 40k
# iterations at batch 16, AdamW (lr 1e-3, weight decay 1e-4) with the 160k schedule's warmup and
# poly decay; the head alone trains. Family leaves set the backbone and the head's widths;
# `*_ms-probe_*` leaves read the last four blocks ("+ms", evaluated with --tta).
_base_ = [
    './models/linear-probe_columnar.py', './datasets/ade20k_512x512.py',
    './schedules/adamw-poly_160k.py', './default_runtime_mmseg.py'
]
custom_imports = dict(imports=['vitdense', 'vitdense.seg'], allow_failed_imports=False)
max_iters = 40000
train_cfg = dict(max_iters=max_iters, val_interval=4000)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, by_epoch=False, begin=1500, end=max_iters),
]
optim_wrapper = dict(optimizer=dict(lr=1e-3, weight_decay=1e-4))
default_hooks = dict(checkpoint=dict(interval=4000))
