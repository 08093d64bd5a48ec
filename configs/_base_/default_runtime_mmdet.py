# mmdet runtime (hooks, logging, visualiser) with the vitdense modules imported, and the
# test-time augmentation `tools/test.py --tta` wraps the model in (mmdet's box merging, masks
# kept; each dataset base states its tta_pipeline); checkpoints are
# saved atomically and loaded with weights_only=True (vitdense.SafeCheckpointHook); every
# process draws its own random numbers (seed + rank, as the DeiT / CaiT / XCiT training code).
_base_ = 'mmdet::_base_/default_runtime.py'
custom_imports = dict(imports=['vitdense', 'vitdense.det'], allow_failed_imports=False)
default_hooks = dict(checkpoint=dict(type='vitdense.SafeCheckpointHook', max_keep_ckpts=3))
# seed=None: process 0 draws one seed and shares it (mmengine's Runner needs the key)
randomness = dict(seed=None, diff_rank_seed=True)
tta_model = dict(type='vitdense.InstanceTTAModel',
                 tta_cfg=dict(nms=dict(type='nms', iou_threshold=0.5), max_per_img=100))
