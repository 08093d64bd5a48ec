# Demo in ViTDet's layout: the small XCiT of upernet_xcit-d6-p8_demo-ade.py through the simple
# feature pyramid (XCA is linear in tokens: no windows), from scratch on the demo ADE20k-layout set.
_base_ = '../_base_/demo_upernet-vitdet_ade.py'
