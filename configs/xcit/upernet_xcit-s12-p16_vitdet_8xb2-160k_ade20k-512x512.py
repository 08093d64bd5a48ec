# UperNet in ViTDet's layout, ADE20k 160k: XCiT-S12/16 as released (drop path 0.05) through the
# simple feature pyramid (XCA is linear in tokens: no windows), layer decay 0.7.
_base_ = '../_base_/upernet_columnar-vitdet_160k_ade20k.py'
