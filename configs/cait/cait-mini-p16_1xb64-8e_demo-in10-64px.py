# Demo: the CaiT ImageNet recipe end to end on the 10-class demo set (64x64, patch 16) with a
# small CaiT (d=128, 6 self-attention + 2 class-attention blocks, 4 heads).
# Generate the data first: python tools/data/gen_demo_imagenet.py data/demo_in10
_base_ = ['../xcit/xcit-mini-p16_1xb64-8e_demo-in10-64px.py']

model = dict(backbone=dict(type='vitdense.CaiT', drop_path_rate=0.1))
