# LoRA fine-tuning of mask2former_vit-adapter-l-p16-dinov3_8xb2-160k_ade20k-896x896.py: rank-16
# adapters (alpha 32) on every trunk block's qkv, projection and FFN layers, the trunk frozen
# as loaded; ViT-Adapter's spatial prior, injectors and extractors and the Mask2Former head
# train fully. Checkpoints hold what trains (vitdense.PeftCheckpointHook, docs/peft.md).
_base_ = './mask2former_vit-adapter-l-p16-dinov3_8xb2-160k_ade20k-896x896.py'
model = dict(backbone=dict(backbone=dict(peft=_base_.lora_r16)))
custom_hooks = [dict(type='vitdense.PeftCheckpointHook')]
