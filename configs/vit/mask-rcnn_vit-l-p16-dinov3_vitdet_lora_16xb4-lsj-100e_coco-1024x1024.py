# LoRA fine-tuning of mask-rcnn_vit-l-p16-dinov3_vitdet_16xb4-lsj-100e_coco-1024x1024.py: rank-16
# adapters (alpha 32) on every block's qkv, projection and FFN layers, the trunk frozen as
# loaded; ViTDet's new relative position tables, the simple feature pyramid and the heads train
# fully. Checkpoints hold what trains (vitdense.PeftCheckpointHook, docs/peft.md).
_base_ = './mask-rcnn_vit-l-p16-dinov3_vitdet_16xb4-lsj-100e_coco-1024x1024.py'
model = dict(backbone=dict(peft=_base_.lora_r16))
custom_hooks = [dict(type='vitdense.PeftCheckpointHook')]
