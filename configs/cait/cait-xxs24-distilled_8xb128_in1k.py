# CaiT-XXS24Υ: the XXS24 recipe with hard distillation (CaiT §4.3, DeiT §5.2). The loss is the
# mean of the label loss and the cross-entropy against the argmax of a frozen convnet teacher
# (the paper's RegNetY-16GF is not in mmpretrain; its in1k RegNetX-12GF stands in).
_base_ = ['./cait-xxs24_8xb128_in1k.py']

model = dict(
    teacher=dict(
        config='mmpretrain::regnet/regnetx-12gf_8xb64_in1k.py',
        checkpoint='https://download.openmmlab.com/mmclassification/v0/regnet/'
        'regnetx-12gf_8xb64_in1k_20211213-5df8c2f8.pth'))
