# XCiT-S12/16 on ImageNet-1k, DeiT recipe as in XCiT §4.1: batch 8 x 128 = 1024, AdamW lr 1e-3,
# 400 epochs, stochastic depth 0.05 (official XCiT setting), LayerScale 1.0 from the arch
# table, evaluation crop ratio 1.0.
_base_ = ['../_base_/deit_in1k_400e.py']

model = dict(
    backbone=dict(type='vitdense.XCiT', arch='small_12', drop_path_rate=0.05),
    head=dict(in_channels=384))
# Weight decay as timm's create_optimizer in the official XCiT code (main.py): none on 1-D
# parameters, biases and the names in the model's no_weight_decay() ({pos_embed, cls_token,
# dist_token}, of which XCiT has cls_token only). The XCA temperatures (heads x 1 x 1) and the
# Fourier encoding's projection weight decay, unlike the DeiT schedule's custom_keys.
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={'_delete_': True, '.cls_token': dict(decay_mult=0.0)}))
