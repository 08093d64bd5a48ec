# Demo in ViT-Adapter's layout: the small ConViT of upernet_convit-d6-p8_demo-ade.py (5 GPSA
# blocks; the class token joins before the last block, the family's rule, and the adapter's
# injectors and extractors see the patch tokens alone) on the demo ADE20k-layout set.
_base_ = '../_base_/demo_upernet-adapter_ade.py'
model = dict(backbone=dict(backbone=dict(type='vitdense.ConViT', img_size=128,
                                         arch=dict(num_local_layers=5))))
