# Demo: LoRA fine-tuning (_base_/demo_lora.py) of the small CaiT of
# upernet_cait-d6-p8_demo-ade.py, its trunk loaded from that demo's trained checkpoint and
# frozen, on the demo ADE20k-layout set.
_base_ = ['./upernet_cait-d6-p8_demo-ade.py', '../_base_/demo_lora.py']
model = dict(backbone=dict(
    peft={{_base_.demo_lora}},
    init_cfg=dict(_delete_=True, type='Pretrained', prefix='backbone.',
                  checkpoint='work_dirs/upernet_cait-d6-p8_demo-ade/iter_700.pth')))
# the adapters at 3x the learning rate (_base_/demo_lora.py); the weight decay stays the demo
# schedule's (AdamW 0.05 by the 'timm' rule): this paramwise_cfg is merged into it
optim_wrapper = dict(paramwise_cfg={{_base_.demo_lora_lr}})
