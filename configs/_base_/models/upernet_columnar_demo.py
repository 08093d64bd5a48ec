# UperNet + auxiliary FCN head for the demo ADE20k-layout set on a CPU: the layers of the full
# recipe, heads narrowed (128 / 64 channels), 5 classes, no padding to 512×512. Trained from
# scratch (BN in the pyramid, no pretrained weights); a small XCiT unless a leaf says otherwise.
_base_ = './upernet_columnar.py'
model = dict(
    data_preprocessor=dict(size=(128, 128)),
    backbone=dict(arch=dict(_delete_=True, embed_dims=128, num_layers=6, num_heads=4),
                  patch_size=8, drop_path_rate=0.0, pyramid_norm_cfg=dict(type='BN'),
                  norm_cfg=dict(type='BN'),
                  init_cfg=None),
    decode_head=dict(in_channels=[128] * 4, channels=128, num_classes=5),
    auxiliary_head=dict(in_channels=128, channels=64, num_classes=5))
