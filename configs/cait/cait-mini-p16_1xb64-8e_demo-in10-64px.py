# Demo: the CaiT recipe on the 10-class demo set with the mini model of the XCiT demo (d=128,
# 6 blocks, 4 heads, talking heads, 2 class-attention blocks). LayerScale starts at 0.1, the
# CaiT paper's ε for networks up to depth 18 (§2; 1e-5 is its value for depth 24).
# Generate the data first: python tools/data/make_demo_data.py imagenet
_base_ = ['../xcit/xcit-mini-p16_1xb64-8e_demo-in10-64px.py']

model = dict(backbone=dict(type='vitdense.CaiT', arch=dict(layer_scale=0.1),
                           drop_path_rate=0.1))
