# ViT-S/16 with the hierarchical MLP stem ("Three things" §5, Appendix C): patches are
# processed independently by 4x4 -> 2x2 -> 2x2 linear maps with BatchNorm and GELU; A2 recipe.
# The paper's stem uses SyncBatchNorm: the runner converts BN layers for distributed training.
_base_ = ['./vit-s-p16_8xb256-a2_in1k.py']

model = dict(backbone=dict(stem='hmlp', stem_norm='BN'))
sync_bn = 'torch'
