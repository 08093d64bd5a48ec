# Recipe: Mask2Former instance segmentation, COCO, mmdet's own recipe (large-scale jitter at
# 1024×1024, batch 16, 368,750 iterations = 50 epochs, AdamW 1e-4, backbone lr × 0.1, scored
# by CocoMetric box and mask AP) with its ResNet-50 replaced by a columnar backbone in
# ViT-Adapter's layout (the trunk's last map added to every level, the official detection
# code). Leaves set the trunk (./models/foundation_trunks.py), the adapter's heads and the
# head's input widths.
_base_ = ['mmdet::mask2former/mask2former_r50_8xb2-lsj-50e_coco.py', './models/vit-adapter.py',
          './models/foundation_trunks.py']
model = dict(
    backbone=dict(_delete_=True, **_base_.vit_adapter),
    panoptic_head=dict(in_channels=[384] * 4))
# what ./default_runtime_mmdet.py sets (the host config brings mmdet's runtime)
custom_imports = dict(imports=['vitdense', 'vitdense.det'], allow_failed_imports=False)
default_hooks = dict(checkpoint=dict(type='vitdense.SafeCheckpointHook'))
randomness = dict(seed=None, diff_rank_seed=True)
