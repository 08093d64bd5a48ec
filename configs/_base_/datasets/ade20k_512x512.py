# ADE20k, 512×512 random crops, 2 images per GPU (8xb2 = batch 16, XCiT paper §4.3),
# single-scale evaluation.
_base_ = 'mmseg::_base_/datasets/ade20k.py'
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = dict(batch_size=1)
