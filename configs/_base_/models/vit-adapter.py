# ViT-Adapter's layout (Chen et al., ICLR 2023, §3 and §4.1) as a variable the dense adapter
# recipes take: the spatial prior (64-wide stem), four interactions of equal depth, 4 points
# and 6 heads of deformable attention per level, CFFN at a quarter width, value width equal to
# the trunk's, two extra extractors, the trunk's last map added to every level (the official
# detection code; the segmentation recipes add the map after interaction i to level i), SyncBN.
# Leaves give the family's trunk (`backbone`, with pyramid=False) and, for wider trunks, the
# heads.
vit_adapter = dict(
    type='vitdense.ColumnarAdapter',
    conv_inplane=64,
    n_points=4,
    deform_num_heads=6,
    init_values=0.,
    with_cffn=True,
    cffn_ratio=0.25,
    deform_ratio=1.0,
    add_vit_feature=True,
    vit_features='last',
    use_extra_extractor=True,
    with_cp=False,
    norm_cfg=dict(type='SyncBN'))
#: the official DeiT trunk: no class token, plain bicubic position resampling, LayerScale of
#: ones (the released checkpoints carry it, `gamma1` / `gamma2`)
deit_trunk = dict(type='vitdense.ViT', patch_size=16, pyramid=False, dense_class_token=False,
                  pos_antialias=False, layer_scale=1.0)
#: the paper's detection trunk: 14×14 windows, global attention in every third block
deit_windows = dict(window_size=14, window_block_indexes=(0, 1, 3, 4, 6, 7, 9, 10))
#: the demo segmentation recipes' adapter around a small trunk (6 blocks, 128 wide, 8×8
#: patches): a 32-wide spatial prior, four interactions (blocks 0-1, 2-3, 4, 5), each level given
#: the trunk's map after its interaction as in the official segmentation code, 4 heads of
#: deformable attention, BN. Family leaves set the trunk's type and options.
demo_seg_adapter = dict(
    vit_adapter, conv_inplane=32, deform_num_heads=4,
    interaction_indexes=((0, 1), (2, 3), (4, 4), (5, 5)), vit_features='per_interaction',
    norm_cfg=dict(type='BN'),
    backbone=dict(arch=dict(embed_dims=128, num_layers=6, num_heads=4), patch_size=8,
                  pyramid=False, drop_path_rate=0.0, norm_cfg=dict(type='BN'), init_cfg=None))
