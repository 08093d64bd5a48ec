# Recipe: Semantic FPN on a columnar backbone, ADE20k 80k iterations (XCiT paper §4.3); family
# leaves set the backbone, its checkpoint and the neck / head widths.
_base_ = [
    './models/fpn_columnar.py', './datasets/ade20k_512x512.py',
    './schedules/adamw-poly_80k.py', './default_runtime_mmseg.py'
]
