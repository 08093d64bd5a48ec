# ImageNet-1k classifier of the DeiT recipe for any vitdense backbone: the backbone returns the
# final normalised class token (CaiT / XCiT: after the class-attention stage) and a linear head
# classifies it. Regularisation: Mixup 0.8, CutMix 1.0, label smoothing 0.1. Each config sets
# the backbone (type, arch, stochastic depth) and the head's in_channels (= embed_dims).
custom_imports = dict(imports=['vitdense', 'vitdense.cls'], allow_failed_imports=False)

model = dict(
    type='vitdense.ViTClassifier',
    backbone=dict(img_size=224, patch_size=16, out_type='cls_token'),
    neck=None,
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        loss=dict(type='LabelSmoothLoss', label_smooth_val=0.1, mode='original')),
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.8), dict(type='CutMix', alpha=1.0)]),
)
