"""ViT (Dosovitskiy et al., 2021) with the options of "Three things everyone should know
about Vision Transformers" (Touvron et al., 2022): parallel blocks (§3), the hMLP stem
(§5, Appendix C) and LayerScale.

Class token and learned absolute positions as in the ViT paper; widths are DeiT's for
tiny/small and ViT's for base/large/huge.
"""
from typing import Optional, Union

import torch.nn as nn

from vitdense.registry import MODELS
from ..layers.attention import MultiheadSelfAttention
from ..layers.blocks import FeedForward, TransformerBlock
from ..layers.embed import HMLPPatchEmbed, LearnedPositionEmbedding, PatchEmbed
from ..layers.relative_bias import RelativePositionBias
from ..layers.rotary import RotaryPositionEmbedding
from ..layers.swiglu import SwiGLU
from .base import ColumnarBackbone
from .checkpoint_vit import VIT_CHECKPOINT_LAYOUT
from .options import AttentionLayout

STEMS = ('linear', 'hmlp')
POS_EMBEDS = ('learn', 'none')
#: the options of the published families timm holds (their sizes: ``ViT.timm_models``):
#: EVA-02 (Fang et al. 2023): rotary positions and SwiGLU (B and L: ``scale_mlp=True``), its
#: rotary reference grid the 16 x 16 of its 224-px pretraining at every fine-tuned size
EVA02 = dict(patch_size=14, mlp_ratio=4 * 2 / 3, swiglu_mlp=True, rope='eva02',
             ref_feat_shape=(16, 16))
#: DINOv3 (Siméoni et al. 2025): rotary positions alone, 4 storage tokens, LayerScale
DINOV3 = dict(pos_embed='none', rope='dinov3', reg_tokens=4, layer_scale=1e-5,
              qkv_bias=False, norm_eps=1e-5)
#: BEiT (Bao et al. 2022): relative position bias in every block, LayerScale
BEIT = dict(pos_embed='none', use_rel_pos_bias=True, layer_scale=1e-5)
#: CLIP's image tower (Radford et al. 2021): a norm before the blocks (OpenAI's: QuickGELU)
CLIP = dict(pre_norm=True, norm_eps=1e-5)


def sam_options(depth: int, global_blocks: tuple[int, ...]) -> dict:
    """SAM's image encoder (Kirillov et al. 2023) in ViTDet's layout: no class token, 14 x 14
    windows in all blocks but ``global_blocks``, relative positions, 1024-px input."""
    return dict(img_size=1024, class_token=False, window_size=14, use_rel_pos=True,
                window_block_indexes=tuple(i for i in range(depth) if i not in global_blocks))


@MODELS.register_module()
class ViT(ColumnarBackbone):
    """ViT backbone.

    Args (each family option left None takes ``arch``'s value, else ``arch_defaults``'s):
        arch: 'tiny', 'small', 'base', 'large', 'huge' or a dict.
        num_parallel: parallel attention / FFN branches per block ("Three things" §3).
        stem: 'linear' patch projection or 'hmlp'.
        stem_norm: 'BN' or 'LN' inside the hMLP stem.
        no_embed_class: the position table has rows for the patches only; the class token
            (and registers) get no position (timm's option: DeiT III, DINOv2).
        reg_tokens: register tokens after the class token (Darcet et al., 2024; timm's
            option: DINOv2 with registers; DINOv3's storage tokens; DeiT-distilled's
            distillation token is one, with its position row: ``reg_tokens=1``).
        pos_embed: 'learn' (a learned absolute table) or 'none' (positions from ``rope``
            alone: DINOv3).
        rope: rotary position embeddings in every block's attention, one of
            ``rotary.ROPE_STYLES``: 'eva02' (EVA-02) or 'dinov3'; None: none.
        rope_temperature: the rotary frequency base (None: the style's: 10000 for EVA-02,
            100 for DINOv3).
        ref_feat_shape: ``rope='eva02'``: the grid (rows, cols) patch coordinates are
            rescaled to, the pretraining grid (timm's name; default ``img_size //
            patch_size``): a detector at 1024 px keeps the 224-px model's 16 x 16.
        qk_norm: LayerNorm of each head's queries and keys (timm's option).
        swiglu_mlp: SwiGLU FFN of ``mlp_ratio`` hidden width (EVA-02: ``mlp_ratio=4 * 2 /
            3``), timm's packed or unpacked tensors alike.
        scale_mlp: SwiGLU: a LayerNorm of the hidden units before ``fc2`` (EVA-02 B/L).
        act_layer: FFN activation, 'gelu' or 'quick_gelu' (OpenAI's CLIP).
        pre_norm: a LayerNorm of the tokens before the first block (``norm_pre``: CLIP).
        resample_patch_embed: load a checkpoint's patch projection of another kernel size
            resampled to ``patch_size`` (FlexiViT's pseudo-inverse resize, timm's
            ``resample_patch_embed``): how EVA-02's detectors take its 14-px kernels at 16 px.
            Not exact: the model computes about what the checkpoint's did.
        use_rel_pos_bias: BEiT's relative position bias in every block (timm's name: BEiT,
            data2vec; with ``pos_embed='none'``), its tables sized for ``img_size`` and
            resampled as BEiT does to other grids (at load and in forward); a pretraining
            checkpoint's shared table is copied to each block.
        res_post_norm: normalise the output of each block's attention and FFN, not their
            input (timm's res-post-norm blocks, ``ResPostBlock``: ``vit_*_rpn_*``).
        class_token: False: a model without class token (SigLIP, timm's ``*_gap`` ViTs; its
            registers, if any, kept), read by ``out_type='avg_featmap'`` or densely; SigLIP's
            attention-pooling head (``attn_pool``) is unused by dense models.
        Other arguments (``depth``, e.g. 18 for ViT-S18×2, ``layer_scale``, ``mlp_ratio``,
        ``qkv_bias`` among them): see :class:`ColumnarBackbone`.
    """

    arch_zoo = {
        'tiny': dict(embed_dims=192, num_layers=12, num_heads=3),
        'small': dict(embed_dims=384, num_layers=12, num_heads=6),
        'base': dict(embed_dims=768, num_layers=12, num_heads=12),
        'large': dict(embed_dims=1024, num_layers=24, num_heads=16),
        'huge': dict(embed_dims=1280, num_layers=32, num_heads=16),
    }
    arch_defaults = dict(mlp_ratio=4., qkv_bias=True, layer_scale=None, num_parallel=1,
                         stem='linear', stem_norm='BN', no_embed_class=False, reg_tokens=0,
                         pos_embed='learn', rope=None, rope_temperature=None,
                         ref_feat_shape=None, qk_norm=False, swiglu_mlp=False,
                         scale_mlp=False, act_layer='gelu', pre_norm=False, class_token=True,
                         use_rel_pos_bias=False, resample_patch_embed=False,
                         res_post_norm=False)
    arch_attributes = dict(pos_embed='pos_embed_type')
    # the family's settings as the builders read them (the constructor's options)
    num_parallel: int
    stem: str
    stem_norm: str
    no_embed_class: bool
    pos_embed_type: str
    rope: Optional[str]
    rope_temperature: Optional[float]
    ref_feat_shape: Optional[tuple[int, int]]
    qk_norm: bool
    swiglu_mlp: bool
    scale_mlp: bool
    act_layer: str
    pre_norm: bool
    use_rel_pos_bias: bool
    resample_patch_embed: bool
    res_post_norm: bool
    checkpoint_layout = VIT_CHECKPOINT_LAYOUT
    no_weight_decay_names = ('table',)  # BEiT's relative position tables
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
        ('small', EVA02, 'eva02_small_patch14_224'),
        ('base', dict(EVA02, scale_mlp=True), 'eva02_base_patch14_224'),
        ('large', dict(EVA02, scale_mlp=True), 'eva02_large_patch14_224'),
        ('small', dict(EVA02, img_size=336), 'eva02_small_patch14_336'),
        ('base', dict(EVA02, scale_mlp=True, img_size=448), 'eva02_base_patch14_448'),
        ('large', dict(EVA02, scale_mlp=True, img_size=448), 'eva02_large_patch14_448'),
        ('small', DINOV3, 'vit_small_patch16_dinov3'),
        ('base', DINOV3, 'vit_base_patch16_dinov3'),
        ('large', DINOV3, 'vit_large_patch16_dinov3'),
        ('base', CLIP, 'vit_base_patch16_clip_224'),
        ('large', dict(CLIP, patch_size=14), 'vit_large_patch14_clip_224'),
        ('base', dict(CLIP, act_layer='quick_gelu'), 'vit_base_patch16_clip_quickgelu_224'),
        ('large', dict(CLIP, patch_size=14, act_layer='quick_gelu'),
         'vit_large_patch14_clip_quickgelu_224'),
        ('base', dict(BEIT, layer_scale=.1), 'beit_base_patch16_224'),
        ('large', BEIT, 'beit_large_patch16_224'),
        ('base', sam_options(12, (2, 5, 8, 11)), 'samvit_base_patch16'),
        ('large', sam_options(24, (5, 11, 17, 23)), 'samvit_large_patch16'),
        ('base', dict(class_token=False), 'vit_base_patch16_siglip_224'),
        ('base', dict(class_token=False, reg_tokens=4, no_embed_class=True, img_size=256),
         'vit_base_patch16_reg4_gap_256'),
        ('base', dict(class_token=False, qkv_bias=False, res_post_norm=True),
         'vit_base_patch16_rpn_224'),
    )

    def __init__(self, arch: Union[str, dict] = 'base', *,
                 num_parallel: Optional[int] = None,
                 stem: Optional[str] = None,
                 stem_norm: Optional[str] = None,
                 no_embed_class: Optional[bool] = None,
                 reg_tokens: Optional[int] = None,
                 pos_embed: Optional[str] = None,
                 rope: Optional[str] = None,
                 rope_temperature: Optional[float] = None,
                 ref_feat_shape: Optional[tuple[int, int]] = None,
                 qk_norm: Optional[bool] = None,
                 swiglu_mlp: Optional[bool] = None,
                 scale_mlp: Optional[bool] = None,
                 act_layer: Optional[str] = None,
                 pre_norm: Optional[bool] = None,
                 class_token: Optional[bool] = None,
                 use_rel_pos_bias: Optional[bool] = None,
                 resample_patch_embed: Optional[bool] = None,
                 res_post_norm: Optional[bool] = None,
                 arch_overrides: Optional[dict] = None,
                 **kwargs) -> None:
        options = {key: value for key, value in locals().items() if key in self.arch_defaults}
        super().__init__(arch, arch_overrides=self.with_options(arch_overrides, options),
                         **kwargs)

    def build_patch_embed(self) -> nn.Module:
        if self.stem not in STEMS:
            raise ValueError(f'unknown stem {self.stem!r}; expected one of {STEMS}')
        if self.stem == 'hmlp':
            return HMLPPatchEmbed(self.in_channels, self.embed_dims, self.patch_size,
                                  self.stem_norm)
        return PatchEmbed(self.in_channels, self.embed_dims, self.patch_size)

    def build_pos_embed(self) -> Optional[nn.Module]:
        if self.reg_tokens < 0:
            raise ValueError(f'reg_tokens must be >= 0, got {self.reg_tokens}')
        if self.pos_embed_type not in POS_EMBEDS:
            raise ValueError(f'unknown pos_embed {self.pos_embed_type!r}; expected one of '
                             f'{POS_EMBEDS}')
        if self.pos_embed_type == 'none':
            return None
        if self.no_embed_class:
            return LearnedPositionEmbedding(self.embed_dims, self.pretrain_grid,
                                            unpositioned_prefix_tokens=self.num_prefix_tokens,
                                            antialias=self.pos_antialias)
        return LearnedPositionEmbedding(self.embed_dims, self.pretrain_grid,
                                        num_prefix_tokens=self.num_prefix_tokens,
                                        checkpoint_prefix_tokens=int(self.class_token)
                                        + self.reg_tokens,
                                        antialias=self.pos_antialias)

    def place_class_token(self) -> int:
        if self.class_token:
            return 0
        if self.out_type == 'cls_token':
            raise ValueError("class_token=False builds no class token: read the model with "
                             "out_type='avg_featmap' or densely (out_type='featmap')")
        return self.num_layers

    def build_block(self, index: int, drop_path: float) -> nn.Module:
        layout = self.block_layouts[index]
        if self.num_parallel < 1:
            raise ValueError(f'num_parallel must be >= 1, got {self.num_parallel}')
        if self.num_parallel > 1 and layout != AttentionLayout():
            raise ValueError('window attention and relative positions do not support '
                             'parallel blocks (num_parallel > 1)')
        mixer = MultiheadSelfAttention(self.embed_dims, self.num_heads, self.qkv_bias,
                                       num_branches=self.num_parallel,
                                       rel_pos_grid=layout.rel_pos_grid,
                                       qk_norm=self.qk_norm, norm_eps=self.norm_eps,
                                       rope=self._rotary_embedding(),
                                       rel_pos_bias=RelativePositionBias(
                                           self.num_heads, self.pretrain_grid)
                                       if self.use_rel_pos_bias else None)
        return TransformerBlock(self.embed_dims, mixer, self.mlp_ratio, self.layer_scale,
                                drop_path, self.drop_rate, num_branches=self.num_parallel,
                                window_size=layout.window_size, norm_eps=self.norm_eps,
                                mlp=self._feed_forward(), res_post_norm=self.res_post_norm)

    def build_norm_pre(self) -> Optional[nn.Module]:
        return nn.LayerNorm(self.embed_dims, eps=self.norm_eps) if self.pre_norm \
            else None

    def _rotary_embedding(self) -> Optional[RotaryPositionEmbedding]:
        """A block's rotary position embedding (``rope``), or None."""
        if self.rope is None:
            return None
        return RotaryPositionEmbedding(self.embed_dims // self.num_heads, self.rope,
                                       self.rope_temperature,
                                       self.ref_feat_shape or self.pretrain_grid)

    def _feed_forward(self) -> Optional[nn.Module]:
        """A block's SwiGLU FFN, or None for the default MLP (with ``act_layer``)."""
        if not self.swiglu_mlp:
            if self.scale_mlp:
                raise ValueError('scale_mlp normalises the hidden units of a SwiGLU FFN: set '
                                 'swiglu_mlp=True')
            return None if self.act_layer == 'gelu' else FeedForward(
                self.embed_dims, int(self.embed_dims * self.mlp_ratio), self.drop_rate,
                self.num_parallel, self.act_layer)
        if self.num_parallel > 1:
            raise ValueError('swiglu_mlp does not support parallel blocks (num_parallel > 1)')
        return SwiGLU(self.embed_dims, int(self.embed_dims * self.mlp_ratio),
                      self.drop_rate, self.scale_mlp, self.norm_eps)
