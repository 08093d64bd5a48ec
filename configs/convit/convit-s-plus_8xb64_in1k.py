# ConViT-S-plus: D_emb/N_h = 64; as in §4 of the paper, batch 512 (8 x 64) and lr 4e-4.
_base_ = ['./convit-s_8xb128_in1k.py']

model = dict(backbone=dict(arch='small_plus'), head=dict(in_channels=576))
train_dataloader = dict(batch_size=64)
optim_wrapper = dict(optimizer=dict(lr=4e-4))
auto_scale_lr = dict(base_batch_size=512)
