# The default backbone of the dense model bases: XCiT-S12/16 as released for dense tasks
# (XCiT §4.2-4.3), BatchNorms synchronised as in the official code. Family leaves replace it.
xcit_s12_p16_backbone = dict(
    type='vitdense.XCiT',
    arch='small_12',
    patch_size=16,
    drop_path_rate=0.05,
    pyramid_norm_cfg=dict(type='SyncBN'),
    norm_cfg=dict(type='SyncBN'),  # stem / LPI BatchNorms, as the official XCiT code
    init_cfg=dict(
        type='Pretrained',
        checkpoint='https://dl.fbaipublicfiles.com/xcit/xcit_small_12_p16_384_dist.pth'))
