# Demo recipe in ViT-Adapter's layout: the demo UperNet (same heads, data, schedule) with the
# backbone's small trunk (6 blocks, 128 wide, 8×8 patches) inside the adapter: a 32-wide
# spatial prior, four interactions (blocks 0-1, 2-3, 4, 5), each level given the trunk's map
# after its interaction as in the official segmentation code, 4 heads of deformable attention,
# BN. Family leaves set the trunk's type and options.
_base_ = ['./demo_upernet_ade.py', './models/vit-adapter.py']
demo_adapter = dict(
    _base_.vit_adapter, conv_inplane=32, deform_num_heads=4,
    interaction_indexes=((0, 1), (2, 3), (4, 4), (5, 5)), vit_features='per_interaction',
    norm_cfg=dict(type='BN'),
    backbone=dict(arch=dict(embed_dims=128, num_layers=6, num_heads=4), patch_size=8,
                  pyramid=False, drop_path_rate=0.0, norm_cfg=dict(type='BN'), init_cfg=None))
model = dict(backbone=dict(_delete_=True, **demo_adapter))
