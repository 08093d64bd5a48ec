# ADE20k, 512×512 random crops, 2 images per GPU (8xb2 = batch 16, XCiT paper §4.3),
# single-scale evaluation at short side 512; `--tta`: ./ade20k_tta.py.
_base_ = ['mmseg::_base_/datasets/ade20k.py', './ade20k_tta.py']
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = dict(batch_size=1)
tta_pipeline = _base_.ade20k_tta_pipeline
