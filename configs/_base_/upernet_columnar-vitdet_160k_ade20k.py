# Recipe: UperNet in ViTDet's layout on a columnar backbone, ADE20k 160k iterations with the
# XCiT paper's segmentation schedule (§4.3) and ViTDet's layer-wise lr decay 0.7 (leaves state
# other values; the schedule's weight decay is kept); family leaves set the backbone, its
# windows, checkpoint and the neck's input. Evaluated in 512² sliding windows at stride 341
# (BEiT, ViT-Adapter), the crop the windows were trained on.
_base_ = [
    './models/upernet_columnar-vitdet.py', './datasets/ade20k_512x512.py',
    './schedules/adamw-poly_160k.py', './default_runtime_mmseg.py'
]
optim_wrapper = dict(paramwise_cfg=dict(layer_decay_rate=0.7))
model = dict(test_cfg=dict(mode='slide', crop_size=(512, 512), stride=(341, 341)))
