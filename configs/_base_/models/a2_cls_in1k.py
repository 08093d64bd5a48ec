# ImageNet-1k classifier of the A2 recipe ("Three things" §2.2): binary cross-entropy on the
# (mixed) targets instead of label-smoothed softmax, Mixup 0.1 and CutMix 1.0.
_base_ = ['./deit_cls_in1k.py']

model = dict(
    head=dict(loss=dict(_delete_=True, type='CrossEntropyLoss', use_sigmoid=True)),
    train_cfg=dict(augments=[dict(type='Mixup', alpha=0.1), dict(type='CutMix', alpha=1.0)]),
)
