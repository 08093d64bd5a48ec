# mmpretrain runtime (hooks, logging, visualiser); checkpoints are saved atomically and loaded
# with weights_only=True (vitdense.SafeCheckpointHook); every process draws its own random
# numbers (seed + rank, as the DeiT / CaiT / XCiT training code).
_base_ = 'mmpretrain::_base_/default_runtime.py'
default_hooks = dict(checkpoint=dict(type='vitdense.SafeCheckpointHook'))
# seed=None: process 0 draws one seed and shares it (mmengine's Runner needs the key)
randomness = dict(seed=None, diff_rank_seed=True)
