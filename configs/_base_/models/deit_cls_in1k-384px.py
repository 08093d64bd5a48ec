# The DeiT-recipe classifier fine-tuned at 384x384 from its 224 checkpoint (DeiT ↑384): the
# backbone is built for 384 and the whole classifier starts from the checkpoint each config
# names in init_cfg; learned position tables are resampled to 24x24 when it loads.
_base_ = ['./deit_cls_in1k.py']

model = dict(backbone=dict(img_size=384), init_cfg=dict(type='Pretrained'))
