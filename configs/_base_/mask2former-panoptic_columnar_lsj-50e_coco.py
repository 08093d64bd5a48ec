# Recipe: Mask2Former panoptic segmentation on a columnar backbone, COCO panoptic, mmdet's own
# recipe (large-scale jitter at 1024×1024, batch 16, 368,750 iterations = 50 epochs, AdamW
# 1e-4, backbone lr × 0.1) with its ResNet-50 replaced by the backbone's multi-layer pyramid
# (features of four blocks at strides 4-32, XCiT paper §4.2). Scored by CocoPanopticMetric
# (PQ) and CocoMetric (box / mask AP of the things). Family leaves set the backbone, its
# checkpoint and the head's input widths.
_base_ = ['mmdet::mask2former/mask2former_r50_8xb2-lsj-50e_coco-panoptic.py',
          './models/xcit-s12-p16_backbone.py']
model = dict(
    backbone=dict(_delete_=True, **_base_.xcit_s12_p16_backbone),
    panoptic_head=dict(in_channels=[384] * 4))
# what ./default_runtime_mmdet.py sets (the host config brings mmdet's runtime): the vitdense
# modules imported, atomic weights-only checkpoints, a seed per process
custom_imports = dict(imports=['vitdense', 'vitdense.det'], allow_failed_imports=False)
default_hooks = dict(checkpoint=dict(type='vitdense.SafeCheckpointHook'))
randomness = dict(seed=None, diff_rank_seed=True)
