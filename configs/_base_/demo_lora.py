# LoRA settings of the demo LoRA recipes (`*_lora_demo-ade.py`): rank-8 adapters (alpha 16)
# from Hugging Face peft on the qkv, output projection and FFN layers of every trunk block.
# The trunk is frozen as loaded; the adapters, the multi-layer pyramid and the heads train.
# A leaf adds them to its family's demo UperNet and loads the trunk from that demo's trained
# checkpoint, where tools/train.py writes it (train the demo first, or point
# model.backbone.init_cfg.checkpoint elsewhere with --cfg-options). The run's checkpoints
# hold what trains and name the frozen base by path and checksum (vitdense.PeftCheckpointHook).
demo_lora = dict(type='LoRA', r=8, alpha=16, targets=('qkv', 'proj', 'fc1', 'fc2'))
# The adapters learn at 3x the recipe's learning rate (every tensor named `lora_`: peft's
# lora_A / lora_B), the pyramid and heads at the recipe's own: LoRA's low-rank update moves
# slowly at full fine-tuning's rate. A leaf merges it into its optim_wrapper's paramwise_cfg
# (docs/benchmarks.md: 1x, 3x and 10x measured).
demo_lora_lr = dict(custom_keys={'lora_': dict(lr_mult=3.0)})
custom_hooks = [dict(type='vitdense.PeftCheckpointHook')]
