# Demo: LoRA fine-tuning (_base_/demo_lora.py) of the small CaiT of
# upernet_cait-d6-p8_demo-ade.py, its trunk loaded from that demo's trained checkpoint and
# frozen, on the demo ADE20k-layout set.
_base_ = ['./upernet_cait-d6-p8_demo-ade.py', '../_base_/demo_lora.py']
model = dict(backbone=dict(
    peft={{_base_.demo_lora}},
    init_cfg=dict(_delete_=True, type='Pretrained', prefix='backbone.',
                  checkpoint='work_dirs/upernet_cait-d6-p8_demo-ade/iter_700.pth')))
optim_wrapper = dict(paramwise_cfg={{_base_.demo_lora_lr}})
