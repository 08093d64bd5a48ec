# Demo: the linear probe of the demo UperNet's small CaiT (trained on the demo
# ADE20k-layout set; load it with load_from), frozen.
_base_ = '../_base_/demo_linear-probe_ade.py'
model = dict(backbone=dict(type='vitdense.CaiT', img_size=128, arch=dict(layer_scale=0.1)))
