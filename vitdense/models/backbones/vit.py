"""ViT (Dosovitskiy et al., 2021) with the options of "Three things everyone should know
about Vision Transformers" (Touvron et al., 2022): parallel blocks (§3), the hMLP stem
(§5, Appendix C) and LayerScale.

Class token and learned absolute positions as in the ViT paper; widths are DeiT's for
tiny/small and ViT's for base/large/huge.
"""
import re
from typing import Optional, Union

import torch
import torch.nn as nn

from vitdense.registry import MODELS
from ..layers.attention import MultiheadSelfAttention
from ..layers.blocks import TransformerBlock
from ..layers.embed import HMLPPatchEmbed, LearnedPositionEmbedding, PatchEmbed
from .base import AttentionLayout, ColumnarBackbone
from .checkpoint_adaptation import Rule, rename_key

STEMS = ('linear', 'hmlp')
#: timm's per-branch modules of a parallel block (``attns.<b>.norm``, ...) -> ours
TIMM_PARALLEL_MODULES = {('attns', 'norm'): 'norm1', ('attns', 'attn'): 'attn',
                         ('attns', 'ls'): 'ls1', ('ffns', 'norm'): 'norm2',
                         ('ffns', 'mlp'): 'mlp', ('ffns', 'ls'): 'ls2'}
#: detectron2's ViTDet detector keys (``ViT`` in ``backbone.net``, ``SimpleFeaturePyramid``
#: stages ``backbone.simfp_<log2 stride>.<index>``) -> ours (``backbone.`` ViT built with
#: ``dense_class_token=False``, ``neck.`` :class:`SimpleFeaturePyramid`)
DETECTRON2_VITDET_RULES: tuple[Rule, ...] = (
    (r'^backbone\.net\.pos_embed$', 'backbone.pos_embed.weight'),
    (r'^backbone\.net\.', 'backbone.'),
    (r'\.attn\.rel_pos_h$', '.attn.rel_pos.height'),
    (r'\.attn\.rel_pos_w$', '.attn.rel_pos.width'),
    # stride 4: transposed conv, LayerNorm, GELU, transposed conv, then the two convs
    (r'^backbone\.simfp_2\.([013])\.', r'neck.rescales.0.\1.'),
    (r'^backbone\.simfp_2\.4\.', 'neck.lateral_convs.0.'),
    (r'^backbone\.simfp_2\.5\.', 'neck.fpn_convs.0.'),
    # stride 8: transposed conv, then the two convs
    (r'^backbone\.simfp_3\.0\.', 'neck.rescales.1.0.'),
    (r'^backbone\.simfp_3\.1\.', 'neck.lateral_convs.1.'),
    (r'^backbone\.simfp_3\.2\.', 'neck.fpn_convs.1.'),
    # stride 16: the two convs; stride 32: max pooling, then the two convs
    (r'^backbone\.simfp_4\.0\.', 'neck.lateral_convs.2.'),
    (r'^backbone\.simfp_4\.1\.', 'neck.fpn_convs.2.'),
    (r'^backbone\.simfp_5\.1\.', 'neck.lateral_convs.3.'),
    (r'^backbone\.simfp_5\.2\.', 'neck.fpn_convs.3.'),
    # detectron2's Conv2d holds its norm; ours is conv + norm
    (r'^(neck\.(lateral|fpn)_convs\.\d\.)weight$', r'\1conv.weight'),
)
#: OpenMMLab's ViT keys (mmpretrain ``VisionTransformer`` / ``DeiT3``, mmseg
#: ``VisionTransformer``) -> ours; mmseg's attention is torch's ``nn.MultiheadAttention``
#: (``in_proj`` holds q, k, v stacked as our ``qkv``)
OPENMMLAB_VIT_RULES: tuple[Rule, ...] = (
    (r'^layers\.', 'blocks.'),
    (r'^ln1\.', 'norm.'),
    (r'^(blocks\.\d+)\.ln([12])\.', r'\1.norm\2.'),
    (r'^patch_embed\.projection\.', 'patch_embed.proj.'),
    (r'\.attn\.attn\.in_proj_(weight|bias)$', r'.attn.qkv.\1'),
    (r'\.attn\.attn\.out_proj\.', '.attn.proj.'),
    (r'\.attn\.gamma1\.weight$', '.ls1.gamma'),
    (r'\.ffn\.gamma2\.weight$', '.ls2.gamma'),
)


def convert_detectron2_vitdet(state_dict: dict) -> dict:
    """The ViT backbone and simple feature pyramid of a detectron2 ViTDet state dict in our
    layout (``backbone.*``, ``neck.*``); other tensors (its RPN and RoI heads) are left out."""
    converted = {rename_key(key, DETECTRON2_VITDET_RULES): value
                 for key, value in state_dict.items()}
    return {key: value for key, value in converted.items()
            if key.startswith(('backbone.', 'neck.'))}


@MODELS.register_module()
class ViT(ColumnarBackbone):
    """ViT backbone.

    Args:
        arch: 'tiny', 'small', 'base', 'large', 'huge' or a dict.
        num_parallel: parallel attention / FFN branches per block ("Three things" §3).
        stem: 'linear' patch projection or 'hmlp'.
        stem_norm: 'BN' or 'LN' inside the hMLP stem.
        no_embed_class: the position table has rows for the patches only; the class token
            (and registers) get no position (timm's option: DeiT III, DINOv2).
        reg_tokens: register tokens after the class token (Darcet et al., 2024; timm's
            option: DINOv2 with registers).
        Other arguments (``depth``, e.g. 18 for ViT-S18×2, and ``layer_scale`` among them):
        see :class:`ColumnarBackbone`.
    """

    arch_zoo = {
        'tiny': dict(embed_dims=192, num_layers=12, num_heads=3),
        'small': dict(embed_dims=384, num_layers=12, num_heads=6),
        'base': dict(embed_dims=768, num_layers=12, num_heads=12),
        'large': dict(embed_dims=1024, num_layers=24, num_heads=16),
        'huge': dict(embed_dims=1280, num_layers=32, num_heads=16),
    }
    arch_defaults = dict(mlp_ratio=4., qkv_bias=True, layer_scale=None, num_parallel=1,
                         stem='linear', stem_norm='BN', no_embed_class=False, reg_tokens=0)
    checkpoint_rules = OPENMMLAB_VIT_RULES
    checkpoint_markers = (r'^blocks\.\d+\.attn\.qkv\.',)
    timm_models = (
        ('tiny', {}, 'vit_tiny_patch16_224'),
        ('small', {}, 'vit_small_patch16_224'),
        ('base', {}, 'vit_base_patch16_224'),
        ('large', {}, 'vit_large_patch16_224'),
        ('huge', dict(patch_size=14), 'vit_huge_patch14_224'),
        ('small', dict(patch_size=8), 'vit_small_patch8_224'),
        ('base', dict(patch_size=32), 'vit_base_patch32_224'),
        ('small', dict(depth=18, num_parallel=2, layer_scale=1e-5),
         'vit_small_patch16_18x2_224'),
        ('small', dict(depth=36, layer_scale=1e-5), 'vit_small_patch16_36x1_224'),
        ('base', dict(depth=18, num_parallel=2, layer_scale=1e-5), 'vit_base_patch16_18x2_224'),
        ('small', dict(stem='hmlp'), None),
    )

    def __init__(self, arch: Union[str, dict] = 'base', *args,
                 num_parallel: Optional[int] = None, stem: Optional[str] = None,
                 stem_norm: Optional[str] = None, no_embed_class: Optional[bool] = None,
                 reg_tokens: Optional[int] = None, **kwargs) -> None:
        given = dict(num_parallel=num_parallel, stem=stem, stem_norm=stem_norm,
                     no_embed_class=no_embed_class, reg_tokens=reg_tokens)
        overrides = {**(kwargs.pop('arch_overrides', None) or {}),
                     **{key: value for key, value in given.items() if value is not None}}
        super().__init__(arch, *args, arch_overrides=overrides, **kwargs)

    def build_patch_embed(self) -> nn.Module:
        if self.arch['stem'] not in STEMS:
            raise ValueError(f'unknown stem {self.arch["stem"]!r}; expected one of {STEMS}')
        if self.arch['stem'] == 'hmlp':
            return HMLPPatchEmbed(self.in_channels, self.embed_dims, self.patch_size,
                                  self.arch['stem_norm'])
        return PatchEmbed(self.in_channels, self.embed_dims, self.patch_size)

    def build_pos_embed(self) -> nn.Module:
        if self.arch['reg_tokens'] < 0:
            raise ValueError(f'reg_tokens must be >= 0, got {self.arch["reg_tokens"]}')
        if self.arch['no_embed_class']:
            return LearnedPositionEmbedding(self.embed_dims, self.pretrain_grid,
                                            unpositioned_prefix_tokens=self.num_prefix_tokens,
                                            antialias=self.pos_antialias)
        return LearnedPositionEmbedding(self.embed_dims, self.pretrain_grid,
                                        num_prefix_tokens=self.num_prefix_tokens,
                                        checkpoint_prefix_tokens=1 + self.arch['reg_tokens'],
                                        antialias=self.pos_antialias)

    def place_class_token(self) -> int:
        return 0

    def build_block(self, index: int, drop_path: float) -> nn.Module:
        arch, layout = self.arch, self.block_layouts[index]
        if arch['num_parallel'] < 1:
            raise ValueError(f'num_parallel must be >= 1, got {arch["num_parallel"]}')
        if arch['num_parallel'] > 1 and layout != AttentionLayout():
            raise ValueError('window attention and relative positions do not support '
                             'parallel blocks (num_parallel > 1)')
        mixer = MultiheadSelfAttention(self.embed_dims, self.num_heads, arch['qkv_bias'],
                                       num_branches=arch['num_parallel'],
                                       rel_pos_grid=layout.rel_pos_grid)
        return TransformerBlock(self.embed_dims, mixer, arch['mlp_ratio'], arch['layer_scale'],
                                drop_path, self.drop_rate, num_branches=arch['num_parallel'],
                                window_size=layout.window_size, norm_eps=self.norm_eps)

    @classmethod
    def merge_checkpoint_tensors(cls, state_dict: dict) -> dict:
        """Stack timm's per-branch parallel modules (``attns.<b>`` / ``ffns.<b>``) into our
        branched parameters; a patch projection saved without bias (mmseg's
        ``patch_bias=False``) gets the zero bias that computes the same."""
        state_dict = super().merge_checkpoint_tensors(state_dict)
        weight = state_dict.get('patch_embed.proj.weight')
        if weight is not None and 'patch_embed.proj.bias' not in state_dict:
            state_dict['patch_embed.proj.bias'] = weight.new_zeros(weight.shape[0])
        pattern = re.compile(r'^(blocks\.\d+)\.(attns|ffns)\.(\d+)\.(\w+)\.(.+)$')
        branches: dict[str, dict[int, torch.Tensor]] = {}
        for key in [k for k in state_dict if pattern.match(k)]:
            block, group, branch, module, param = pattern.match(key).groups()
            target = f'{block}.{TIMM_PARALLEL_MODULES[group, module]}.{param}'
            branches.setdefault(target, {})[int(branch)] = state_dict.pop(key)
        for target, tensors in branches.items():
            stacked = torch.stack([tensors[b] for b in sorted(tensors)])
            if target.split('.')[2].startswith('ls'):
                stacked = stacked.view(len(tensors), 1, 1, -1)
            state_dict[target] = stacked
        return state_dict

    @classmethod
    def split_for_timm(cls, state_dict: dict) -> dict:
        """Our branched parameters (blocks whose norms hold one row per branch) as timm's
        per-branch modules ``attns.<b>`` / ``ffns.<b>``: the inverse of
        :meth:`merge_checkpoint_tensors`."""
        state_dict = super().split_for_timm(state_dict)
        branched = {key[:-len('.norm1.weight')] for key, value in state_dict.items()
                    if re.match(r'^blocks\.\d+\.norm1\.weight$', key) and value.dim() == 2}
        timm_modules = {ours: theirs for theirs, ours in TIMM_PARALLEL_MODULES.items()}
        pattern = re.compile(r'^(blocks\.\d+)\.(norm1|attn|ls1|norm2|mlp|ls2)\.(.+)$')
        for key in list(state_dict):
            match = pattern.match(key)
            if not match or match.group(1) not in branched:
                continue
            block, module, param = match.groups()
            group, name = timm_modules[module]
            for branch, tensor in enumerate(state_dict.pop(key)):
                tensor = tensor.reshape(-1) if module.startswith('ls') else tensor
                state_dict[f'{block}.{group}.{branch}.{name}.{param}'] = tensor.clone()
        return state_dict
