# Recipe: UperNet on a columnar backbone, ADE20k 160k iterations (XCiT paper §4.3); family
# leaves set the backbone, its checkpoint and the heads' input widths.
_base_ = [
    './models/upernet_columnar.py', './datasets/ade20k_512x512.py',
    './schedules/adamw-poly_160k.py', './default_runtime_mmseg.py'
]
