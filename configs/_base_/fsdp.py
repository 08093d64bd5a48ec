# Fully sharded data parallel training (FSDP2, ZeRO-3): each GPU keeps 1/N of the parameters,
# gradients and optimizer state and gathers one block's parameters at a time
# (docs/large_models.md). Add this file last to a config's _base_ list, or pass the same two
# keys as --cfg-options. A LAMB recipe (A2) also sets
# optim_wrapper.optimizer.type='vitdense.ShardedLamb'; --amp is refused, bf16 is
# model_wrapper_cfg.param_dtype='bfloat16'.
runner_type = 'vitdense.ShardedRunner'
model_wrapper_cfg = dict(type='vitdense.FullyShardedModel')
