# XCiT-S12/16Υ: the S12/16 recipe with hard distillation from a frozen convnet teacher (XCiT
# Table 1, following DeiT), see cait-xxs24-distilled_8xb128_in1k.py.
_base_ = ['./xcit-s12-p16_8xb128_in1k.py']

model = dict(
    teacher=dict(
        config='mmpretrain::regnet/regnetx-12gf_8xb64_in1k.py',
        checkpoint='https://download.openmmlab.com/mmclassification/v0/regnet/'
        'regnetx-12gf_8xb64_in1k_20211213-5df8c2f8.pth'))
