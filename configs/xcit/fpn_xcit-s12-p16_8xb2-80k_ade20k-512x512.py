# Semantic FPN, ADE20k 80k, XCiT-S12/16 (the _base_ model, XCiT paper Tables 5-6).
_base_ = [
    '../_base_/models/fpn_columnar.py', '../_base_/datasets/ade20k_512x512.py',
    '../_base_/schedules/adamw-poly_80k.py', '../_base_/default_runtime_mmseg.py'
]
