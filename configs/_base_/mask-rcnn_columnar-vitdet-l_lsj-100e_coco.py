# Recipe: ./mask-rcnn_columnar-vitdet_lsj-100e_coco.py for a ViT-L trunk as ViTDet trains
# ViT-L (Li et al., 2022; detectron2 projects/ViTDet mask_rcnn_vitdet_l_100ep.py): 14×14
# windows with global blocks 5, 11, 17, 23, layer-wise lr decay 0.8 (the schedule's
# weight decay kept), the neck reading 1024 channels; the trunk's blocks recomputed in
# backward (`with_cp`), so that 4 images per GPU fit 32 GB in mixed precision (EVA-02-L
# without it: 34.2 GiB by tools/analysis_tools/memory.py). Leaves set the trunk
# (./models/foundation_trunks.py) with ViTDet-L's drop path 0.4.
_base_ = ['./mask-rcnn_columnar-vitdet_lsj-100e_coco.py', './models/foundation_trunks.py']
model = dict(backbone=dict(**_base_.vitdet_windows_24, with_cp=True), neck=dict(in_channels=1024))
optim_wrapper = dict(paramwise_cfg=dict(layer_decay_rate=0.8))
