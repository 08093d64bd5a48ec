# Demo in ViT-Adapter's layout: the small XCiT of upernet_xcit-d6-p8_demo-ade.py from scratch
# on the demo ADE20k-layout set.
_base_ = '../_base_/demo_upernet-adapter_ade.py'
model = dict(backbone=dict(backbone=dict(type='vitdense.XCiT')))
