# mmdet runtime (hooks, logging, visualiser) with the vitdense modules imported; checkpoints are
# saved atomically and loaded with weights_only=True (vitdense.SafeCheckpointHook); every
# process draws its own random numbers (seed + rank, as the DeiT / CaiT / XCiT training code).
_base_ = 'mmdet::_base_/default_runtime.py'
custom_imports = dict(imports=['vitdense'], allow_failed_imports=False)
default_hooks = dict(checkpoint=dict(type='vitdense.SafeCheckpointHook', max_keep_ckpts=3))
# seed=None: process 0 draws one seed and shares it (mmengine's Runner needs the key)
randomness = dict(seed=None, diff_rank_seed=True)
