"""What the columnar families share: arch tables, the dense / classification forward,
the multi-layer pyramid, freezing and activation checkpointing (the options' checks:
:mod:`.options`; training's: :mod:`.training`; checkpoint adaptation:
:mod:`.checkpoint_adaptation`).

A family (one file each) states its arch table, how its patch embedding, position encoding,
blocks and class-attention blocks are built, and how official / timm checkpoint keys map to
ours. Everything else lives here once.
"""
import inspect
from typing import Optional, Sequence, Union

import torch
import torch.nn as nn
from mmengine.model import BaseModule
from torch.utils.checkpoint import checkpoint

from ..layers.blocks import NORM_EPS
from ..layers.embed import LearnedPositionEmbedding, PatchEmbed
from ..layers.branched import BranchedLinear
from ..layers.grid import pad_to_multiple, tokens_to_map
from ..layers.pyramid import MultiLevelPyramid
from .checkpoint_adaptation import init_with_pretrained
from .checkpoint_layout import CheckpointLayout
from .options import (AttentionLayout, apply_peft, arch_settings, attention_layouts,
                      batch_norm_type, check_options, check_output_cls_token,
                      check_token_layouts, checked_overrides, constructor_parameters,
                      out_indices_read, pretrained_init_cfg, pyramid_levels_read, to_pair)
from .training import TrainingModes


class ColumnarBackbone(TrainingModes, BaseModule):
    """Base of the columnar backbones (see ``docs/backbone_contract.md``).

    Args:
        arch: a name from ``arch_zoo`` or a dict with at least ``arch_keys``.
        patch_size: patch stride of the token grid.
        img_size: pretraining resolution; only sizes learned position tables.
        in_channels: image channels.
        out_type: 'featmap' (dense maps), 'cls_token' or 'avg_featmap' (a (B, C) vector).
        out_indices: 0-based blocks whose outputs form the dense features, one per pyramid
            level (default: the official dense recipes' blocks, e.g. 3, 5, 7, 11 of 12).
        pyramid: bring the dense features to strides 4/8/16/32.
        pyramid_levels: which of the pyramid's levels come out, as indices into the strides
            (4, 8, 16, 32), as mmdet's ResNet ``out_indices`` picks stages: ``(1, 2, 3)``
            gives strides 8-32 for 3-level necks (DINO's ChannelMapper, RTMDet's
            CSPNeXtPAFPN). Default: all four.
        pyramid_norm_cfg: norm inside the pyramid's upsampling branch.
        norm_cfg: type of the BatchNorm layers inside the backbone (convolutional stems,
            the local patch interaction): ``dict(type='BN')`` or ``dict(type='SyncBN')``,
            the latter as the official dense code of El-Nouby et al. 2021 (statistics over
            all GPUs' images).
        padding: inputs whose size is not a multiple of the patch size. 'image': zero-pad
            the image at the bottom / right to a multiple of the patch size, pool the
            pyramid in ceil mode and crop every level to the input's ceil(H / stride) ×
            ceil(W / stride) (any patch embedding). 'stem': each stride-2 convolution of the
            stem pads its input, the pyramid pools in floor mode, nothing is cropped: the
            official dense forward of El-Nouby et al. 2021, which their dense checkpoints
            were evaluated with (a convolutional stem only). Both agree on multiples of 32.
        drop_rate: dropout after the position encoding and inside FFNs.
        drop_path_rate: stochastic depth (uniform or linearly increasing, per family).
        frozen_stages: -1 freezes nothing; k >= 0 freezes the embeddings (patch embedding,
            position encoding, registers) and the first k blocks (mmdet's ResNet convention:
            0 freezes the stem), and the class token once k >= ``class_token_layer``, where
            it joins (as mmpretrain's XCiT; ``docs/backbone_contract.md``).
        norm_eval: keep BatchNorm layers in eval mode while training.
        with_cp: activation checkpointing while training with gradients recorded (a
            block's activations are recomputed in backward instead of kept: about a third
            more compute for those blocks): True for every block, an int K for the first K
            blocks only (memory and compute traded block by block), False for none.
        window_size: > 0: blocks in ``window_block_indexes`` attend within windows of this
            many tokens a side, the grid zero-padded to a multiple of it (Li et al. 2022,
            §3); the others keep global attention. Families with token attention only
            (``token_attention``); the trunk must carry no class token.
        window_block_indexes: 0-based blocks with window attention (None: all).
        use_rel_pos: add Li et al.'s decomposed relative position bias to every block's attention
            logits: tables for the window, or for the grid of ``rel_pos_img_size`` in global
            blocks; zero-initialised, so an ImageNet checkpoint starts as it was.
        rel_pos_img_size: image size the global blocks' relative tables are built for
            (Li et al.: the 1024 input; default ``img_size``); other grids resample them.
        dense_class_token: False: a dense model's trunk carries no class token (Li et al.: the
            checkpoint's class token and its position row are dropped on load), as window
            attention and relative positions need.
        output_cls_token: each dense output becomes a (map, class token) pair, the class
            token (B, embed_dims) as the probed block left it (mmseg's ``VisionTransformer``
            convention, read by DINOv2's linear head with the class token and mmseg's DPT
            head). Needs ``pyramid=False`` and a trunk that carries its class token at every
            block of ``out_indices`` (ViT; ConViT past its GPSA blocks).
        norm_eps: epsilon of every LayerNorm of the blocks and of the final norm: 1e-6 as
            timm and the official releases, 1e-5 for mmseg's ViTs (torch's default).
        fc_norm: with ``out_type='avg_featmap'``, normalise the averaged tokens (timm's
            ``fc_norm``, MAE's fine-tuned layout) instead of averaging normalised tokens.
        pos_antialias: resample learned position tables to other grids with antialiasing
            (timm's kernel); False: plain bicubic, as detectron2's ``get_abs_pos``, mmpretrain
            and mmseg. None (default): the kernel of the library whose layout a
            ``Pretrained`` checkpoint has (``checkpoint_layout.position_kernels``), at load and
            in forward; antialiased where no checkpoint says otherwise.
        init_cfg: mmengine initialisation; a ``Pretrained`` entry loads its checkpoint
            through :func:`.checkpoint_adaptation.adapt_checkpoint` (official, timm or ours).
        pretrained: a checkpoint path or URL, as mmseg's own backbones take it (mmseg's
            ``EncoderDecoder`` passes its model-level ``pretrained`` here): becomes
            ``init_cfg=dict(type='Pretrained', checkpoint=pretrained)``, with a warning that
            ``init_cfg`` is the way to say it; giving both is an error.
        depth: the number of blocks (timm's name), replacing ``arch``'s ``num_layers``.
        layer_scale: LayerScale's initial value (an arch value of None: no LayerScale).
        mlp_ratio: FFN hidden width over ``embed_dims``.
        qkv_bias: biases of the query, key and value maps. These three are arch keys of
            every family: given, each replaces ``arch``'s value; None keeps it (else the
            family's ``arch_defaults``).
        arch_overrides: settings that replace those of ``arch``: how a family passes its
            own constructor options (``stem``, ...) to its builders. Its keys, as a custom
            ``arch`` dict's, are checked: an unknown one raises naming the valid ones.
        peft: parameter-efficient fine-tuning through Hugging Face ``peft``, e.g.
            ``dict(type='LoRA', r=16, alpha=32, targets=('qkv', 'proj', 'fc1', 'fc2'),
            blocks=None)``: adapters on those layers of the trunk's blocks, everything a
            pretrained checkpoint supplies frozen (:class:`.peft_tuning.PeftTuning` lists
            the settings). None: every tensor trains.
    """

    arch_zoo: dict[str, dict] = {}
    arch_keys: tuple[str, ...] = ('embed_dims', 'num_layers', 'num_heads')
    arch_defaults: dict = {}
    #: arch settings kept under another attribute name, where the setting's name is that of
    #: a module of the model (ViT's ``pos_embed``, 'learn' or 'none', and its position table)
    arch_attributes: dict[str, str] = {}
    # every arch setting is an attribute of the model (``_set_arch``): the shape, FFN
    # width, qkv biases and LayerScale of every family, and the prefix tokens the base
    # builds, whose defaults hold for a family without such an option (ViT's
    # ``class_token`` and ``reg_tokens``)
    embed_dims: int
    num_layers: int
    num_heads: int
    layer_scale: Optional[float]
    mlp_ratio: float
    qkv_bias: bool
    num_cls_layers: int
    class_token: bool = True
    reg_tokens: int = 0
    uniform_drop_path = False
    #: whether the trunk's token mixers are token attention (window attention and relative
    #: positions apply to them)
    token_attention = True
    #: parameter names (the last part) a family's own layers train without weight decay,
    #: beside the shared ones (class token, position encodings, LayerScale, relative
    #: position tables)
    no_weight_decay_names: tuple[str, ...] = ()
    #: the family's named variants as (arch, constructor options, the timm model it
    #: reproduces or None where timm has none): how a timm checkpoint finds its arch
    timm_models: tuple[tuple[str, dict, Optional[str]], ...] = ()
    #: what the family's checkpoints look like (keys, layouts, its timm model's keywords):
    #: an object beside the model, read by the loader, the diagnosis and the export
    checkpoint_layout = CheckpointLayout('ColumnarBackbone')

    def __new__(cls, *args, **kwargs) -> 'ColumnarBackbone':
        """A backbone that keeps the options it is built with (``constructor_options``), so
        that a refused load can build the model its advice names and check it."""
        model = super().__new__(cls)
        object.__setattr__(model, 'constructor_options', (args, dict(kwargs)))
        return model

    def given_options(self) -> dict:
        """The options this backbone was built with, by name (not the defaults it took)."""
        args, kwargs = self.constructor_options
        names = list(inspect.signature(type(self).constructor_signature).parameters)[1:]
        return {**dict(zip(names, args)), **kwargs}

    def __init__(self,
                 arch: Union[str, dict],
                 patch_size: int = 16,
                 img_size: Union[int, Sequence[int]] = 224,
                 in_channels: int = 3,
                 out_type: str = 'featmap',
                 out_indices: Optional[Sequence[int]] = None,
                 pyramid: bool = True,
                 pyramid_norm_cfg: Optional[dict] = None,
                 pyramid_levels: Optional[Sequence[int]] = None,
                 norm_cfg: Optional[dict] = None,
                 padding: str = 'image',
                 drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: Union[bool, int] = False,
                 window_size: int = 0,
                 window_block_indexes: Optional[Sequence[int]] = None,
                 use_rel_pos: bool = False,
                 rel_pos_img_size: Optional[Union[int, Sequence[int]]] = None,
                 dense_class_token: bool = True,
                 output_cls_token: bool = False,
                 fc_norm: bool = False,
                 norm_eps: float = NORM_EPS,
                 pos_antialias: Optional[bool] = None,
                 init_cfg: Optional[Union[dict, list]] = None,
                 pretrained: Optional[str] = None,
                 depth: Optional[int] = None,
                 layer_scale: Optional[float] = None,
                 mlp_ratio: Optional[float] = None,
                 qkv_bias: Optional[bool] = None,
                 arch_overrides: Optional[dict] = None,
                 peft: Optional[dict] = None) -> None:
        super().__init__(init_cfg=pretrained_init_cfg(pretrained, init_cfg))
        self._set_arch(arch, self.with_options(arch_overrides, dict(
            num_layers=depth, layer_scale=layer_scale, mlp_ratio=mlp_ratio,
            qkv_bias=qkv_bias)))
        self.patch_size, self.in_channels, self.norm_eps = patch_size, in_channels, norm_eps
        self.img_size = to_pair(img_size)
        self.pretrain_grid = tuple(size // patch_size for size in self.img_size)
        check_options(out_type, padding, with_cp, fc_norm)
        self.out_type, self.fc_norm_after_pooling = out_type, fc_norm
        self.dense = out_type == 'featmap'
        self.pyramid_levels = pyramid_levels_read(pyramid_levels, pyramid and self.dense)
        self.out_indices = out_indices_read(out_indices, self.num_layers, self.pyramid_levels)
        self.frozen_stages, self.norm_eval, self.with_cp = frozen_stages, norm_eval, with_cp
        self.drop_rate, self.padding = drop_rate, padding
        self._build_embeddings(dense_class_token, pos_antialias)
        self._set_output_cls_token(output_cls_token)
        #: how each trunk block attends (window size, relative position tables)
        self.block_layouts = self._attention_layouts(
            window_size, window_block_indexes, use_rel_pos, rel_pos_img_size or img_size)
        self._build_trunk(drop_path_rate)
        self._build_outputs(pyramid_norm_cfg)
        self._set_batch_norm(norm_cfg or dict(type='BN'))
        self._init_parameters()
        self.peft = apply_peft(self, peft)
        self._freeze_stages()

    constructor_signature = __init__

    def _set_output_cls_token(self, output_cls_token: bool) -> None:
        """``output_cls_token``, checked against the outputs and the block the class token
        joins."""
        self.output_cls_token = output_cls_token
        if output_cls_token:
            check_output_cls_token(type(self).__name__, self.out_type, self.pyramid_levels,
                                   self.out_indices, self.class_token_layer
                                   if self.trunk_has_class_token else None)

    def init_weights(self) -> None:
        """mmengine's initialisation, its ``Pretrained`` entries loaded exactly or refused
        (:func:`.checkpoint_adaptation.init_with_pretrained`)."""
        init_with_pretrained(self, super().init_weights)

    def __init_subclass__(cls, **kwargs) -> None:
        """A family's signature (``inspect.signature``, ``help()``) names its own options and
        the base's, which its constructor passes on as ``**kwargs``."""
        super().__init_subclass__(**kwargs)
        cls.__signature__ = constructor_parameters(cls, ColumnarBackbone)

    @staticmethod
    def with_options(arch_overrides: Optional[dict], options: dict) -> dict:
        """``arch_overrides`` with the constructor ``options`` that were given (not None) on
        top: how the base's and a family's keywords reach the arch settings."""
        given = {key: value for key, value in options.items() if value is not None}
        return {**(arch_overrides or {}), **given}

    # ------------------------------------------------------------------ family hooks
    def build_patch_embed(self) -> nn.Module:
        """Module mapping an image (B, C, H, W) to (tokens (B, N, D), (rows, cols)): by
        default the ViT paper's linear patch projection."""
        return PatchEmbed(self.in_channels, self.embed_dims, self.patch_size)

    def build_pos_embed(self) -> Optional[nn.Module]:
        """Module mapping (tokens, grid) to tokens with position information, or None: by
        default a learned table of the pretraining grid, resampled to other grids."""
        return LearnedPositionEmbedding(self.embed_dims, self.pretrain_grid,
                                        antialias=self.pos_antialias)

    def build_norm_pre(self) -> Optional[nn.Module]:
        """A norm of the tokens before the first block (timm's ``norm_pre``: CLIP), or
        None."""
        return None

    def build_block(self, index: int, drop_path: float) -> nn.Module:
        """Trunk block ``index``: a module mapping (tokens, grid) to tokens, built with
        ``self.block_layouts[index]`` where the family has token attention."""
        raise NotImplementedError

    def build_class_attention_block(self) -> nn.Module:
        """One block of the class-attention stage (families whose class token joins after
        the trunk)."""
        raise NotImplementedError

    def place_class_token(self) -> int:
        """Where the class token joins: before trunk block i (0: from the start), or
        ``num_layers`` (the default): after the trunk, in a class-attention stage of
        ``num_cls_layers`` blocks that exists for classification only (Touvron et
        al. 2021, "Going deeper", §3)."""
        return self.num_layers

    @property
    def num_registers(self) -> int:
        """Register tokens (Darcet et al., 2024) the trunk carries after its class token
        (ViT's ``reg_tokens``): none where a dense trunk leaves its class token out, all of
        them in a model built without one (ViT's ``class_token=False``)."""
        keeps_registers = self.trunk_has_class_token or not self.class_token
        return self.reg_tokens if keeps_registers else 0

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens the trunk carries before the patches: class token, registers."""
        return int(self.trunk_has_class_token) + self.num_registers

    @property
    def trunk_has_class_token(self) -> bool:
        """Whether the trunk blocks carry the class token (dense outputs included)."""
        return self.class_token_layer < self.num_layers

    # ------------------------------------------------------------------ construction
    @classmethod
    def resolve_arch(cls, arch: Union[str, dict]) -> dict:
        """The arch settings for a table name or a custom dict (``depth``, timm's name, for
        ``num_layers`` accepted), with family defaults."""
        return arch_settings(cls, arch)

    def _set_arch(self, arch: Union[str, dict], overrides: dict) -> None:
        """``self.arch``: the resolved ``arch`` with ``overrides`` (checked keys) on top;
        each of its settings an attribute (``arch_attributes`` renames), which the builders
        read."""
        overrides = checked_overrides(type(self), overrides)
        self.arch_name = arch if isinstance(arch, str) else 'custom'
        self.arch = {**self.resolve_arch(arch), **overrides}
        for key, value in self.arch.items():
            setattr(self, self.arch_attributes.get(key, key), value)

    def _build_embeddings(self, dense_class_token: bool, pos_antialias: Optional[bool]) -> None:
        """Patch embedding, where the class token joins, position encoding."""
        #: the kernel resampling position tables; ``pos_kernel_chosen``: the user's, not the
        #: default that a checkpoint's library may replace
        self.pos_antialias = True if pos_antialias is None else pos_antialias
        self.pos_kernel_chosen = pos_antialias is not None
        self.patch_embed = self.build_patch_embed()
        if self.padding == 'stem' and not getattr(self.patch_embed, 'pads_input', False):
            raise ValueError(f"padding='stem' needs a patch embedding that pads its own input "
                             f"(a convolutional stem); {type(self.patch_embed).__name__} would "
                             f"drop the pixels beyond the last full patch: use "
                             f"padding='image'")
        self.class_token_layer = self.place_class_token()
        if self.dense and not dense_class_token:
            self.class_token_layer = self.num_layers
        self.pos_embed = self.build_pos_embed()
        self.pos_drop = nn.Dropout(self.drop_rate)
        self.norm_pre = self.build_norm_pre()

    def _build_trunk(self, drop_path_rate: float) -> None:
        """The blocks, with their stochastic depth rates, and which of them recompute."""
        if self.uniform_drop_path:
            rates = [drop_path_rate] * self.num_layers
        else:
            # on the CPU whatever the default device (models are also built on 'meta')
            rates = torch.linspace(0, drop_path_rate, self.num_layers, device='cpu').tolist()
        self.blocks = nn.ModuleList(
            self.build_block(i, rates[i]) for i in range(self.num_layers))
        #: blocks that recompute their activations in backward (``with_cp``)
        self.checkpointed_blocks = frozenset(range(
            self.num_layers if self.with_cp is True else min(int(self.with_cp),
                                                             self.num_layers)))

    def _build_outputs(self, pyramid_norm_cfg: Optional[dict]) -> None:
        """Class-attention stage, final norm and class token (classification), or the
        multi-level pyramid (dense)."""
        self.cls_blocks = None
        if self.out_type == 'cls_token' and not self.trunk_has_class_token:
            self.cls_blocks = nn.ModuleList(self.build_class_attention_block()
                                            for _ in range(self.num_cls_layers))
        if not self.dense:
            # named as in timm: ``fc_norm`` where the pooled tokens are normalised
            setattr(self, 'fc_norm' if self.fc_norm_after_pooling else 'norm',
                    nn.LayerNorm(self.embed_dims, eps=self.norm_eps))
        has_cls = self.trunk_has_class_token or self.cls_blocks is not None
        self.cls_token = nn.Parameter(torch.zeros(1, 1, self.embed_dims)) if has_cls else None
        self.reg_token = None
        if self.num_registers:
            self.reg_token = nn.Parameter(torch.zeros(1, self.num_registers, self.embed_dims))
        self.pyramid = None
        if self.pyramid_levels:
            self.pyramid = MultiLevelPyramid(self.embed_dims, self.patch_size,
                                             pyramid_norm_cfg or dict(type='BN'),
                                             crop=self.padding == 'image',
                                             levels=self.pyramid_levels)

    def _attention_layouts(self, window_size: int,
                           window_block_indexes: Optional[Sequence[int]], use_rel_pos: bool,
                           rel_pos_img_size: Union[int, Sequence[int]]
                           ) -> tuple[AttentionLayout, ...]:
        """Each trunk block's :class:`.options.AttentionLayout`, which the family's
        ``build_block`` passes on; windows and relative positions checked to suit the family
        (:func:`.options.check_token_layouts`)."""
        layouts = attention_layouts(self.num_layers, self.patch_size, window_size,
                                    window_block_indexes, use_rel_pos, rel_pos_img_size)
        if all(layout == AttentionLayout() for layout in layouts):
            return layouts
        check_token_layouts(type(self).__name__, self.token_attention,
                            self.num_prefix_tokens, self.class_token_layer)
        return layouts

    def _set_batch_norm(self, norm_cfg: dict) -> None:
        """Make the BatchNorm layers of the stem and the blocks ``norm_cfg['type']``."""
        if batch_norm_type(norm_cfg) == 'SyncBN':
            self.patch_embed = nn.SyncBatchNorm.convert_sync_batchnorm(self.patch_embed)
            self.blocks = nn.SyncBatchNorm.convert_sync_batchnorm(self.blocks)

    def _init_parameters(self) -> None:
        """timm's init: truncated normal (std .02) linear weights and class token."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, BranchedLinear)):
                nn.init.trunc_normal_(module.weight, std=.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for token in (self.cls_token, self.reg_token):
            if token is not None:
                nn.init.trunc_normal_(token, std=.02)

    # ------------------------------------------------------------------ forward
    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f'{type(self).__name__} expects images of shape (B, '
                             f'{self.in_channels}, H, W), got {tuple(x.shape)}')

    def run_block(self, index: int, block: nn.Module, tokens: torch.Tensor,
                  hw: tuple[int, int], **kwargs) -> torch.Tensor:
        """Block ``index`` on ``tokens`` (recomputed in backward where ``with_cp`` says)."""
        # whenever gradients are recorded, not only when the tokens need one: the first
        # block of a frozen embedding (peft adapters) gets no such tokens, yet its adapters
        # do; a block where nothing needs a gradient saves nothing either way
        if index in self.checkpointed_blocks and self.training and torch.is_grad_enabled():
            return checkpoint(block, tokens, hw, use_reentrant=False, **kwargs)
        return block(tokens, hw, **kwargs)

    def _prepend_cls_token(self, tokens: torch.Tensor) -> torch.Tensor:
        """The class token and the registers, those the model has, before ``tokens``."""
        prefix = [token for token in (self.cls_token, self.reg_token) if token is not None]
        return torch.cat([t.expand(tokens.shape[0], -1, -1) for t in prefix] + [tokens], dim=1)

    def join_class_token(self, index: int, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens`` entering block ``index``, the class token prepended if it joins
        there after block 0 (ConViT: after its GPSA blocks)."""
        if index and index == self.class_token_layer:
            return self._prepend_cls_token(tokens)
        return tokens

    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """The tokens entering the first block and their patch grid: images padded (with
        ``padding='image'``), patches embedded, the prefix tokens that join before block 0,
        positions, dropout and the pre-norm. Models that run the blocks themselves (EoMT)
        start from here."""
        self._check_input(x)
        if self.padding == 'image':
            x = pad_to_multiple(x, self.patch_size)
        tokens, hw = self.patch_embed(x)
        if self.class_token_layer == 0 or self.cls_token is None and self.reg_token is not None:
            tokens = self._prepend_cls_token(tokens)
        if self.pos_embed is not None:
            tokens = self.pos_embed(tokens, hw)
        tokens = self.pos_drop(tokens)
        if self.norm_pre is not None:
            tokens = self.norm_pre(tokens)
        return tokens, hw

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        tokens, hw = self.embed(x)
        image_hw = (x.shape[2], x.shape[3])

        features, class_tokens = [], []
        last = self.out_indices[-1] if self.dense else self.num_layers - 1
        # a classifier reading the trunk's class token needs only that token from the last
        # block (the same output; the patch tokens' FFN and queries are skipped)
        reads_trunk_class_token = self.out_type == 'cls_token' and self.trunk_has_class_token
        for index, block in enumerate(self.blocks[:last + 1]):
            tokens = self.join_class_token(index, tokens)
            extra = dict(num_queries=1) if reads_trunk_class_token and index == last else {}
            tokens = self.run_block(index, block, tokens, hw, **extra)
            if self.dense and index in self.out_indices:
                features.append(tokens_to_map(tokens, hw))
                if self.output_cls_token:
                    class_tokens.append(tokens[:, 0].contiguous())
        if not self.dense:
            return (self._pool(tokens),)
        if self.pyramid is not None:
            features = self.pyramid(features, image_hw)
        # Token maps are channels-last views of the sequence, and convs keep that layout.
        # mmcv's RoIAlign indexes its input buffer as contiguous NCHW whatever the
        # strides, so RoI heads would pool scrambled features: hand out contiguous maps.
        features = tuple(feature.contiguous() for feature in features)
        if self.output_cls_token:
            return tuple(zip(features, class_tokens))
        return features

    def _pool(self, tokens: torch.Tensor) -> torch.Tensor:
        num_prefix = self.num_prefix_tokens
        if self.fc_norm_after_pooling:
            return self.fc_norm(tokens[:, num_prefix:].mean(dim=1))
        if self.out_type == 'avg_featmap':
            return self.norm(tokens[:, num_prefix:]).mean(dim=1)
        if self.trunk_has_class_token:
            return self.norm(tokens[:, 0])
        cls_token = self.cls_token.expand(tokens.shape[0], -1, -1)
        for block in self.cls_blocks:
            cls_token, tokens = block(cls_token, tokens)
        return self.norm(cls_token[:, 0])
