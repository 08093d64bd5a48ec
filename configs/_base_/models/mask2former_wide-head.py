# ViT-Adapter's Mask2Former head for its large trunk (the official
# mask2former_beit_adapter_large_*_ade20k_ss.py): 1024 wide with 32 heads and 4096-wide FFNs in
# the pixel decoder's six deformable encoder layers and the nine decoder layers (mmseg's and
# mmdet's head: 256 wide, 8 heads). A variable the large recipes merge into their head.
mask2former_wide_head = dict(
    feat_channels=1024, out_channels=1024,
    pixel_decoder=dict(
        encoder=dict(layer_cfg=dict(self_attn_cfg=dict(embed_dims=1024, num_heads=32),
                                    ffn_cfg=dict(embed_dims=1024, feedforward_channels=4096))),
        positional_encoding=dict(num_feats=512)),
    positional_encoding=dict(num_feats=512),
    transformer_decoder=dict(layer_cfg=dict(
        self_attn_cfg=dict(embed_dims=1024, num_heads=32),
        cross_attn_cfg=dict(embed_dims=1024, num_heads=32),
        ffn_cfg=dict(embed_dims=1024, feedforward_channels=4096))))
