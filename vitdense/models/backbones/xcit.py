"""XCiT: Cross-Covariance Image Transformers (El-Nouby et al., 2021).

Blocks are XCA (attention over channels, linear in the number of tokens) + LPI + FFN on a
convolutional patch embedding with Fourier position encoding; classification adds two
class-attention blocks. Table 1 of the paper gives the sizes below.
"""
import re
from dataclasses import dataclass
from typing import Optional, Union

import torch.nn as nn

from vitdense.registry import MODELS
from ..layers.attention import CrossCovarianceAttention
from ..layers.blocks import TransformerBlock, XCiTClassAttentionBlock
from ..layers.embed import ConvPatchEmbed, FourierPositionEncoding
from .base import ColumnarBackbone
from .checkpoint_keys import Alias, KeyTable, Rename
from .checkpoint_layout import CheckpointLayout


#: mmpretrain's XCiT keys -> ours (after timm's renames): ConvModules (``conv`` / ``bn``) in
#: the stem, the position projection and the LPI; ``xca_layers`` / ``ca_layers`` for the
#: blocks
OPENMMLAB_XCIT_KEYS: tuple[Alias, ...] = (
    Alias('^xca_layers.', '^blocks.'),
    Alias('^ca_layers.', '^cls_blocks.'),
    Alias('^pos_embed.token_projection.conv.', '^pos_embed.token_projection.'),
    Alias('.lpi.conv1.bn.', '.lpi.bn.'),
    Alias('.lpi.conv{n:1|2}.conv.', '.lpi.conv{n}.'),
) + tuple(Alias(f'^patch_embed.proj.{i}.{name}.', f'^patch_embed.proj.{2 * i}.{index}.')
          for i in range(4) for index, name in enumerate(('conv', 'bn')))


#: the class-attention blocks as the official release and timm (``cls_attn_blocks``) and
#: mmpretrain (``ca_layers``) save them: files whose ``tokens_norm`` their config set
FOREIGN_CLASS_ATTENTION = r'^(cls_attn_blocks|ca_layers)\.'
#: the released XCiTs' (width, depth) -> their ``tokens_norm`` (official, timm and
#: mmpretrain alike: nano normalises the class token alone, every other size all tokens)
RELEASED_TOKENS_NORM = {(128, 12): False, (192, 12): True, (192, 24): True, (384, 12): True,
                        (384, 24): True, (512, 24): True, (768, 24): True}


@dataclass(frozen=True)
class XCiTCheckpointLayout(CheckpointLayout):
    """XCiT's checkpoints: where the class-attention blocks of a foreign file normalise
    (``tokens_norm``), which no tensor shows, told by a released size or chosen. (Our own
    files are read with the model's setting.)"""

    def unchosen_options(self, model: nn.Module, saved_keys: list[str], converted: dict
                         ) -> list[str]:
        """``tokens_norm`` for a model that builds class attention and was not given it
        (a keyword, ``arch_overrides`` or an arch dict): the released size's where the
        model's differs; for a file of no released size, either (timm's and mmpretrain's
        class default is False, ours True), which the file's config must choose."""
        norm = converted.get('blocks.0.norm1.weight')
        foreign = any(re.match(FOREIGN_CLASS_ATTENTION, key) for key in saved_keys)
        if model.cls_blocks is None or self.chosen(model, 'tokens_norm') or norm is None or \
                not foreign:
            return super().unchosen_options(model, saved_keys, converted)
        depth = len({key.split('.')[1] for key in converted if key.startswith('blocks.')})
        released = RELEASED_TOKENS_NORM.get((norm.shape[-1], depth))
        if released is None:
            advice = ['tokens_norm=False or tokens_norm=True (whether the class-attention '
                      'blocks normalise all tokens, which no tensor shows: timm\'s and '
                      'mmpretrain\'s default is False: set the file\'s)']
        elif released != model.tokens_norm:
            advice = [f'tokens_norm={released} (the class-attention norm of the released '
                      f'XCiT of this size, which no tensor shows)']
        else:
            advice = []
        return advice + super().unchosen_options(model, saved_keys, converted)


@MODELS.register_module()
class XCiT(ColumnarBackbone):
    """XCiT backbone; ``arch`` in ``arch_zoo`` (e.g. 'small_12'), ``patch_size`` 16 or 8.

    ``layer_scale`` is the paper's η; ``tokens_norm`` normalises all tokens in the
    class-attention blocks (all models but nano, as released).
    """

    arch_zoo = {
        'nano_12': dict(embed_dims=128, num_layers=12, num_heads=4, layer_scale=1.0,
                        tokens_norm=False),
        'tiny_12': dict(embed_dims=192, num_layers=12, num_heads=4, layer_scale=1.0),
        'tiny_24': dict(embed_dims=192, num_layers=24, num_heads=4, layer_scale=1e-5),
        'small_12': dict(embed_dims=384, num_layers=12, num_heads=8, layer_scale=1.0),
        'small_24': dict(embed_dims=384, num_layers=24, num_heads=8, layer_scale=1e-5),
        'medium_24': dict(embed_dims=512, num_layers=24, num_heads=8, layer_scale=1e-5),
        'large_24': dict(embed_dims=768, num_layers=24, num_heads=16, layer_scale=1e-5),
    }
    arch_defaults = dict(mlp_ratio=4., layer_scale=1.0, tokens_norm=True, qkv_bias=True,
                         num_cls_layers=2)
    # the family's setting as the builders read it (the constructor's option)
    tokens_norm: bool
    uniform_drop_path = True
    token_attention = False  # XCA attends over channels
    no_weight_decay_names = ('temperature',)  # XCA's per-head temperatures
    #: timm's XCiT, as the official release (which names the position encoding
    #: ``pos_embeder``): class attention in ``cls_attn_blocks``, LayerScale ``gamma1`` /
    #: ``gamma2``, the LPI ``local_mp`` with its norm ``norm3`` and LayerScale ``gamma3``
    checkpoint_layout = XCiTCheckpointLayout(
        'XCiT',
        keys=KeyTable(keys=(
            Alias('^pos_embeder.', '^pos_embed.'),
            Rename('^cls_attn_blocks.', '^cls_blocks.'),
            Rename('.gamma3$', '.ls_lpi.gamma$'),
            Rename('.gamma{n:1|2}$', '.ls{n}.gamma$'),
            Rename('.norm3.', '.norm_lpi.'),
            Rename('.local_mp.', '.lpi.'),
        ) + OPENMMLAB_XCIT_KEYS),
        markers=(r'^blocks\.\d+\.attn\.qkv\.', r'\.attn\.temperature$'),
        timm_arguments=dict(layer_scale='eta', tokens_norm='tokens_norm',
                            num_cls_layers='cls_attn_layers'))
    timm_models = tuple((arch, dict(patch_size=p), f'xcit_{arch}_p{p}_224')
                        for arch in arch_zoo for p in (16, 8))

    def __init__(self, arch: Union[str, dict] = 'small_12', *,
                 tokens_norm: Optional[bool] = None,
                 num_cls_layers: Optional[int] = None,
                 arch_overrides: Optional[dict] = None, **kwargs) -> None:
        """Family options left None take ``arch``'s value, else ``arch_defaults``'s:
            ``tokens_norm``: the class-attention blocks normalise all tokens, not the class
            token alone (True; nano: False);
            ``num_cls_layers``: class-attention blocks (2).
        Other arguments: see :class:`ColumnarBackbone`."""
        options = {key: value for key, value in locals().items() if key in self.arch_defaults}
        super().__init__(arch, arch_overrides=self.with_options(arch_overrides, options),
                         **kwargs)

    def build_patch_embed(self) -> nn.Module:
        return ConvPatchEmbed(self.in_channels, self.embed_dims, self.patch_size)

    def build_pos_embed(self) -> nn.Module:
        return FourierPositionEncoding(self.embed_dims)

    def build_block(self, index: int, drop_path: float) -> nn.Module:
        mixer = CrossCovarianceAttention(self.embed_dims, self.num_heads, self.qkv_bias)
        return TransformerBlock(self.embed_dims, mixer, self.mlp_ratio, self.layer_scale,
                                drop_path, self.drop_rate, local_patch_interaction=True,
                                norm_eps=self.norm_eps)

    def build_class_attention_block(self) -> nn.Module:
        return XCiTClassAttentionBlock(self.embed_dims, self.num_heads, self.mlp_ratio,
                                       self.layer_scale, self.qkv_bias,
                                       tokens_norm=self.tokens_norm, norm_eps=self.norm_eps)
