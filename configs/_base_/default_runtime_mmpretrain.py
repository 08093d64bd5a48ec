# mmpretrain runtime (hooks, logging, visualiser); checkpoints are saved atomically and loaded
# with weights_only=True (vitdense.SafeCheckpointHook).
_base_ = 'mmpretrain::_base_/default_runtime.py'
default_hooks = dict(checkpoint=dict(type='vitdense.SafeCheckpointHook'))
