# Recipe: ./mask2former-panoptic_columnar_lsj-50e_coco.py (mmdet's Mask2Former panoptic recipe,
# scored by CocoPanopticMetric) on a columnar backbone in ViT-Adapter's layout (the trunk's
# last map added to every level, the official detection code) instead of the multi-layer
# pyramid. Leaves set the trunk (./models/foundation_trunks.py), the adapter's heads and the
# head's input widths.
_base_ = ['./mask2former-panoptic_columnar_lsj-50e_coco.py', './models/vit-adapter.py',
          './models/foundation_trunks.py']
model = dict(
    backbone=dict(_delete_=True, **_base_.vit_adapter),
    panoptic_head=dict(in_channels=[384] * 4))
