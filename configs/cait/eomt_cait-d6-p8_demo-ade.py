# Demo: EoMT with a small CaiT (6 blocks, 128 wide, 8×8 patches, LayerScale 0.1 as the CaiT
# paper uses for shallow models; its talking heads take the masks on their written-out maps)
# from scratch on the demo ADE20k-layout set. out_type='avg_featmap' builds the final norm the
# mask module reads through and no class-attention stage (EoMT does not run one).
_base_ = '../_base_/demo_eomt_ade.py'
model = dict(backbone=dict(backbone=dict(
    type='vitdense.CaiT', out_type='avg_featmap', arch=dict(layer_scale=0.1))))
