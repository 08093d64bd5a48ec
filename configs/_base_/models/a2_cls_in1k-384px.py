# The A2-recipe classifier fine-tuned at 384x384 from its 224 checkpoint, as
# deit_cls_in1k-384px.py: head and BCE loss carry over from pretraining.
_base_ = ['./a2_cls_in1k.py']

model = dict(backbone=dict(img_size=384), init_cfg=dict(type='Pretrained'))
