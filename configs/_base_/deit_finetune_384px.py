# Fine-tuning at 384x384 (DeiT ↑384, CaiT §4.3): the DeiT fine-tuning schedule (30 epochs,
# AdamW lr 5e-6 at batch 512) with mmpretrain's runtime.
_base_ = ['./schedules/deit_finetune_adamw_30e.py', './default_runtime_mmpretrain.py']
