# Demo recipe in ViT-Adapter's layout: the demo UperNet (same heads, data, schedule) with the
# backbone's small trunk inside the demo adapter (`demo_seg_adapter` of ./models/vit-adapter.py).
# Family leaves set the trunk's type and options.
_base_ = ['./demo_upernet_ade.py', './models/vit-adapter.py']
model = dict(backbone=dict(_delete_=True, **_base_.demo_seg_adapter))
