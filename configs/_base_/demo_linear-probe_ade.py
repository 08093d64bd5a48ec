# Demo recipe: the linear probe on the demo UperNet's small XCiT (6 blocks, 128 wide, 8×8
# patches), its data and schedule; the backbone comes from a trained demo checkpoint
# (`--cfg-options load_from=<UperNet demo checkpoint>`: its backbone tensors load, the rest of
# it is reported unused) and stays as loaded; family leaves swap the backbone.
_base_ = './demo_upernet_ade.py'
custom_imports = dict(imports=['vitdense', 'vitdense.seg'], allow_failed_imports=False)
model = dict(
    type='vitdense.FrozenBackboneSegmentor',
    backbone=dict(pyramid=False, out_indices=(-1,), pyramid_norm_cfg=None),
    decode_head=dict(
        _delete_=True, type='vitdense.LinearProbeHead', in_channels=[128], in_index=[0],
        num_classes=5, dropout_ratio=0.0, norm_cfg=dict(type='BN'), align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)),
    auxiliary_head=None)
