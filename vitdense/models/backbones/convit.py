"""ConViT: soft convolutional inductive biases (d'Ascoli et al., 2021).

The first ``num_local_layers`` blocks use gated positional self-attention (GPSA) with a
convolutional init; the class token joins after them, before the plain self-attention
blocks (§3). Widths are 48 channels per head, or 64 for the "+" models (Table 1).
"""
from typing import Optional, Union

import torch.nn as nn

from vitdense.registry import MODELS
from ..layers.attention import GatedPositionalSelfAttention, MultiheadSelfAttention
from ..layers.blocks import TransformerBlock
from .base import ColumnarBackbone
from .checkpoint_keys import KeyTable, Rename
from .checkpoint_layout import CheckpointLayout


def _convit(num_heads: int, head_dims: int = 48) -> dict:
    return dict(embed_dims=num_heads * head_dims, num_layers=12, num_heads=num_heads)


@MODELS.register_module()
class ConViT(ColumnarBackbone):
    """ConViT backbone; ``arch`` in ``arch_zoo`` (e.g. 'small', 'tiny_plus'); its query, key
    and value maps have no biases unless ``qkv_bias=True`` (``arch_defaults``, as
    released)."""

    arch_zoo = {
        'tiny': _convit(4), 'small': _convit(9), 'base': _convit(16),
        'tiny_plus': _convit(4, 64), 'small_plus': _convit(9, 64), 'base_plus': _convit(16, 64),
    }
    arch_defaults = dict(mlp_ratio=4., qkv_bias=False, num_local_layers=10,
                         locality_strength=1.0, layer_scale=None)
    # the family's settings as the builders read them (the constructor's options)
    num_local_layers: int
    locality_strength: float
    no_weight_decay_names = ('gating',)  # GPSA's gates
    #: timm's ConViT, as the official release: GPSA's gate ``gating_param``; timm's
    #: ``embed_dim`` is per head
    checkpoint_layout = CheckpointLayout(
        'ConViT',
        keys=KeyTable(keys=(Rename('.attn.gating_param$', '.attn.gating$'),)),
        markers=(r'^blocks\.\d+\.attn\.qkv\.', r'\.attn\.gating$'),
        timm_arguments=dict(num_local_layers='local_up_to_layer',
                            locality_strength='locality_strength'),
        timm_embed_dim_per_head=True)
    timm_models = (
        ('tiny', {}, 'convit_tiny'), ('small', {}, 'convit_small'), ('base', {}, 'convit_base'),
        ('tiny_plus', {}, None), ('small_plus', {}, None), ('base_plus', {}, None),
    )

    def __init__(self, arch: Union[str, dict] = 'small', *,
                 num_local_layers: Optional[int] = None,
                 locality_strength: Optional[float] = None,
                 arch_overrides: Optional[dict] = None, **kwargs) -> None:
        """Family options left None take ``arch``'s value, else ``arch_defaults``'s:
            ``num_local_layers``: the first blocks, with gated positional self-attention
            (10);
            ``locality_strength``: GPSA's locality strength α at initialisation (1).
        Other arguments: see :class:`ColumnarBackbone`."""
        options = {key: value for key, value in locals().items() if key in self.arch_defaults}
        super().__init__(arch, arch_overrides=self.with_options(arch_overrides, options),
                         **kwargs)

    def place_class_token(self) -> int:
        num_local = self.num_local_layers
        if not 0 <= num_local < self.num_layers:
            raise ValueError(f'num_local_layers must be in [0, num_layers) = [0, '
                             f'{self.num_layers}) so that the class token joins a block, '
                             f'got {num_local}')
        return num_local

    def build_block(self, index: int, drop_path: float) -> nn.Module:
        layout = self.block_layouts[index]
        if index < self.num_local_layers:
            mixer = GatedPositionalSelfAttention(self.embed_dims, self.num_heads,
                                                 self.qkv_bias,
                                                 locality_strength=self.locality_strength,
                                                 rel_pos_grid=layout.rel_pos_grid)
        else:
            mixer = MultiheadSelfAttention(self.embed_dims, self.num_heads, self.qkv_bias,
                                           rel_pos_grid=layout.rel_pos_grid)
        return TransformerBlock(self.embed_dims, mixer, self.mlp_ratio, self.layer_scale,
                                drop_path, self.drop_rate, window_size=layout.window_size,
                                norm_eps=self.norm_eps)

    def _init_parameters(self) -> None:
        super()._init_parameters()
        for module in self.modules():
            if isinstance(module, GatedPositionalSelfAttention):
                module.convolutional_init()
