"""CaiT: Going deeper with Image Transformers (Touvron et al., 2021).

A ViT trunk without class token, with LayerScale (ε per depth, Table 3) and talking-heads
attention; classification appends the class token in two class-attention blocks (§3).
Widths use 48 channels per head.
"""
from typing import Optional, Union

import torch.nn as nn

from vitdense.registry import MODELS
from ..layers.attention import MultiheadSelfAttention
from ..layers.blocks import ClassAttentionBlock, TransformerBlock
from .base import ColumnarBackbone
from .checkpoint_keys import KeyTable, Rename
from .checkpoint_layout import CheckpointLayout


def _cait(embed_dims: int, num_layers: int, layer_scale: float) -> dict:
    return dict(embed_dims=embed_dims, num_layers=num_layers, num_heads=embed_dims // 48,
                layer_scale=layer_scale)


@MODELS.register_module()
class CaiT(ColumnarBackbone):
    """CaiT backbone; ``arch`` in ``arch_zoo`` (e.g. 'xxs24', 's36')."""

    arch_zoo = {
        'xxs24': _cait(192, 24, 1e-5), 'xxs36': _cait(192, 36, 1e-6),
        'xs24': _cait(288, 24, 1e-5), 'xs36': _cait(288, 36, 1e-6),
        's24': _cait(384, 24, 1e-5), 's36': _cait(384, 36, 1e-6), 's48': _cait(384, 48, 1e-6),
        'm24': _cait(768, 24, 1e-5), 'm36': _cait(768, 36, 1e-6), 'm48': _cait(768, 48, 1e-6),
    }
    arch_defaults = dict(mlp_ratio=4., layer_scale=1e-5, qkv_bias=True, num_cls_layers=2)
    uniform_drop_path = True
    #: timm's CaiT, as the official release: class attention in ``blocks_token_only``,
    #: talking heads' maps ``proj_l`` / ``proj_w``, LayerScale ``gamma_1`` / ``gamma_2``
    checkpoint_layout = CheckpointLayout(
        'CaiT',
        keys=KeyTable(keys=(
            Rename('^blocks_token_only.', '^cls_blocks.'),
            Rename('.attn.proj_l.', '.attn.mix_logits.'),
            Rename('.attn.proj_w.', '.attn.mix_weights.'),
            Rename('.gamma_{n:1|2}$', '.ls{n}.gamma$'),
        )),
        markers=(r'^blocks\.\d+\.attn\.qkv\.', r'\.attn\.mix_logits\.'),
        timm_arguments=dict(layer_scale='init_values', num_cls_layers='depth_token_only'))
    timm_models = (
        ('xxs24', {}, 'cait_xxs24_224'), ('xxs36', {}, 'cait_xxs36_224'),
        ('xs24', dict(img_size=384), 'cait_xs24_384'), ('xs36', {}, None),
        ('s24', {}, 'cait_s24_224'), ('s36', dict(img_size=384), 'cait_s36_384'),
        ('s48', {}, None), ('m24', {}, None),
        ('m36', dict(img_size=384), 'cait_m36_384'), ('m48', dict(img_size=448), 'cait_m48_448'),
    )

    def __init__(self, arch: Union[str, dict] = 's24', *,
                 num_cls_layers: Optional[int] = None,
                 arch_overrides: Optional[dict] = None, **kwargs) -> None:
        """Family options left None take ``arch``'s value, else ``arch_defaults``'s:
            ``num_cls_layers``: class-attention blocks (2).
        Other arguments: see :class:`ColumnarBackbone`."""
        options = {key: value for key, value in locals().items() if key in self.arch_defaults}
        super().__init__(arch, arch_overrides=self.with_options(arch_overrides, options),
                         **kwargs)

    def build_block(self, index: int, drop_path: float) -> nn.Module:
        layout = self.block_layouts[index]
        mixer = MultiheadSelfAttention(self.embed_dims, self.num_heads, self.qkv_bias,
                                       talking_heads=True, rel_pos_grid=layout.rel_pos_grid)
        return TransformerBlock(self.embed_dims, mixer, self.mlp_ratio, self.layer_scale,
                                drop_path, self.drop_rate, window_size=layout.window_size,
                                norm_eps=self.norm_eps)

    def build_class_attention_block(self) -> nn.Module:
        return ClassAttentionBlock(self.embed_dims, self.num_heads, self.mlp_ratio,
                                   self.layer_scale, self.qkv_bias, norm_eps=self.norm_eps)
