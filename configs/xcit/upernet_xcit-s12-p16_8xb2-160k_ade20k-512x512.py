# UperNet, ADE20k 160k, XCiT-S12/16 (the _base_ model, XCiT paper Tables 5-6).
_base_ = [
    '../_base_/models/upernet_columnar.py', '../_base_/datasets/ade20k_512x512.py',
    '../_base_/schedules/adamw-poly_160k.py', '../_base_/default_runtime_mmseg.py'
]
