"""A fifth columnar family in one file, as docs/add_a_family.md writes one: a plain token
attention trunk without class token, LayerScale, a learned position table and a two-block
class-attention stage for classification. It uses the public hooks only (an arch table,
``build_patch_embed``, ``build_pos_embed``, ``build_block``, ``build_class_attention_block``,
``no_weight_decay_names``) and registers itself in the ``vitdense`` scope on import; nothing
else in the repository names it."""
from typing import Optional, Union

import torch.nn as nn

from vitdense.models import ColumnarBackbone
from vitdense.models.layers import (ClassAttentionBlock, LearnedPositionEmbedding,
                                    MultiheadSelfAttention, PatchEmbed, TransformerBlock)
from vitdense.registry import MODELS


@MODELS.register_module()
class ToyFormer(ColumnarBackbone):
    """Toy backbone; ``arch`` 'mini' or a dict."""

    arch_zoo = {'mini': dict(embed_dims=32, num_layers=4, num_heads=2)}
    arch_defaults = dict(mlp_ratio=2., layer_scale=1e-4, qkv_bias=True, num_cls_layers=2)

    def __init__(self, arch: Union[str, dict] = 'mini', *, num_cls_layers: Optional[int] = None,
                 arch_overrides: Optional[dict] = None, **kwargs) -> None:
        options = {key: value for key, value in locals().items() if key in self.arch_defaults}
        super().__init__(arch, arch_overrides=self.with_options(arch_overrides, options),
                         **kwargs)

    def build_patch_embed(self) -> nn.Module:
        return PatchEmbed(self.in_channels, self.embed_dims, self.patch_size)

    def build_pos_embed(self) -> nn.Module:
        return LearnedPositionEmbedding(self.embed_dims, self.pretrain_grid,
                                        antialias=self.pos_antialias)

    def build_block(self, index: int, drop_path: float) -> nn.Module:
        layout = self.block_layouts[index]
        mixer = MultiheadSelfAttention(self.embed_dims, self.num_heads, self.qkv_bias,
                                       rel_pos_grid=layout.rel_pos_grid)
        return TransformerBlock(self.embed_dims, mixer, self.mlp_ratio, self.layer_scale,
                                drop_path, self.drop_rate, window_size=layout.window_size)

    def build_class_attention_block(self) -> nn.Module:
        return ClassAttentionBlock(self.embed_dims, self.num_heads, self.mlp_ratio,
                                   self.layer_scale, self.qkv_bias)
