# ViT-Ti/16 A2 baseline ("Three things" §2.2): lr 4e-3, no stochastic depth.
# Weight decay: A2 (timm optimizer factory): 1-D parameters, biases, pos_embed and cls_token exempt
# (_base_/schedules/a2_lamb_300e.py).
_base_ = ['./vit-s-p16_8xb256-a2_in1k.py']

model = dict(backbone=dict(arch='tiny', drop_path_rate=0.0), head=dict(in_channels=192))
