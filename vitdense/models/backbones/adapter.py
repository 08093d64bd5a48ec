"""ViT-Adapter's dense layout (Chen et al., ICLR 2023) around any columnar family: the third
way to make a backbone dense, beside the multi-layer pyramid and ViTDet's simple pyramid.

The family's backbone is built unchanged (``pyramid=False``) and kept as ``trunk``; the
adapter runs its embeddings and blocks, groups of blocks between an injector and an
extractor, so the family files know nothing of it. Where the trunk carries a class token
(ViT with ``dense_class_token=True``, ConViT after its GPSA blocks) it joins where the family
says and passes through the blocks; the injectors and extractors see patch tokens only.
CaiT's and XCiT's class-attention stages are classification-only and not built.
"""
from typing import Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule

from vitdense.registry import MODELS
from ..layers.adapter import AdapterGeometry, Interaction, SpatialPriorModule
from ..layers.grid import tokens_to_map
from ..layers.norm import build_norm2d
from .base import ColumnarBackbone

#: the spatial prior's levels the injectors read: strides 8, 16, 32
PRIOR_LEVELS = 3
#: which trunk map is added to each output level (``vit_features``): the last one to every
#: level (the official detection release), or the map after interaction i to level i (the
#: official segmentation release)
VIT_FEATURES = ('last', 'per_interaction')


def default_interaction_indexes(num_layers: int) -> tuple[tuple[int, int], ...]:
    """Four groups of equal depth (the paper's N = 4, §4.1): (0, 2), (3, 5), (6, 8),
    (9, 11) for 12 blocks."""
    if num_layers % 4:
        raise ValueError(f'{num_layers} blocks do not split into four equal interaction '
                         f'groups: give interaction_indexes')
    step = num_layers // 4
    return tuple((i * step, (i + 1) * step - 1) for i in range(4))


@MODELS.register_module()
class ColumnarAdapter(BaseModule):
    """A columnar backbone in ViT-Adapter's layout: four maps at strides 4, 8, 16, 32, all
    ``embed_dims`` wide.

    Args:
        backbone: the family's backbone config (``type='vitdense.<Family>'``, built with
            ``pyramid=False`` and ``out_type='featmap'``) or the module itself.
        conv_inplane: width of the spatial prior's stem (64 in the paper).
        n_points: sampling points per head and level of the deformable attention.
        deform_num_heads: heads of the deformable attention.
        init_values: the injectors' initial output scale (0: the trunk starts as
            pretrained).
        interaction_indexes: (first, last) trunk block of each interaction group, in order
            and covering the trunk (default: four equal groups).
        with_cffn: the extractors' convolutional FFN.
        cffn_ratio: the CFFN's hidden width as a share of the trunk's.
        deform_ratio: the deformable attention's value width as a share of the trunk's.
        add_vit_feature: add a trunk map, resized, to every level.
        vit_features: which trunk map each level gets: ``'last'``, the last one for every
            level (the official detection code), or ``'per_interaction'``, the map after
            interaction i for level i (the official segmentation code; four interactions).
        use_extra_extractor: two more extractors after the last group.
        drop_path_rate: stochastic depth of the extractors' CFFN (the official code passes
            the trunk's maximal rate).
        with_cp: recompute the injectors and extractors in backward (the trunk's blocks
            follow the trunk's own ``with_cp``).
        norm_cfg: the norm of the spatial prior and of the four outputs (``SyncBN`` in the
            paper's recipes).
        init_cfg: mmengine initialisation of the whole adapter; the trunk's own ``init_cfg``
            loads an ImageNet checkpoint into the trunk alone.
    """

    def __init__(self,
                 backbone: Union[dict, ColumnarBackbone],
                 conv_inplane: int = 64,
                 n_points: int = 4,
                 deform_num_heads: int = 6,
                 init_values: float = 0.,
                 interaction_indexes: Optional[Sequence[Sequence[int]]] = None,
                 with_cffn: bool = True,
                 cffn_ratio: float = 0.25,
                 deform_ratio: float = 1.0,
                 add_vit_feature: bool = True,
                 vit_features: str = 'last',
                 use_extra_extractor: bool = True,
                 drop_path_rate: float = 0.,
                 with_cp: bool = False,
                 norm_cfg: Optional[dict] = None,
                 init_cfg: Optional[Union[dict, list]] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.trunk = self._build_trunk(backbone)
        dims = self.trunk.embed_dims
        self.interaction_indexes = self._check_groups(interaction_indexes)
        self.add_vit_feature = add_vit_feature
        if vit_features not in VIT_FEATURES:
            raise ValueError(f'vit_features must be one of {VIT_FEATURES}, got {vit_features!r}')
        if vit_features == 'per_interaction' and len(self.interaction_indexes) != 4:
            raise ValueError(f"vit_features='per_interaction' adds the map after interaction i "
                             f"to level i of four: give four interaction groups, got "
                             f"{len(self.interaction_indexes)}, or use vit_features='last'")
        self.vit_features = vit_features
        norm_cfg = norm_cfg or dict(type='SyncBN')
        self.level_embed = nn.Parameter(torch.zeros(PRIOR_LEVELS, dims))
        self.spm = SpatialPriorModule(conv_inplane, dims, self.trunk.in_channels, norm_cfg)
        last = len(self.interaction_indexes) - 1
        self.interactions = nn.Sequential(*(
            Interaction(dims, deform_num_heads, n_points, deform_ratio, init_values,
                        with_cffn, cffn_ratio, drop_path_rate,
                        extra_extractors=use_extra_extractor and i == last, with_cp=with_cp)
            for i in range(len(self.interaction_indexes))))
        self.up = nn.ConvTranspose2d(dims, dims, 2, 2)
        self.norm1, self.norm2, self.norm3, self.norm4 = (
            build_norm2d(norm_cfg, dims) for _ in range(4))
        self._init_adapter()

    @staticmethod
    def _build_trunk(backbone: Union[dict, ColumnarBackbone]) -> ColumnarBackbone:
        if isinstance(backbone, dict):
            backbone = MODELS.build(dict(dict(pyramid=False), **backbone))
        if not isinstance(backbone, ColumnarBackbone):
            raise TypeError(f'backbone must be a columnar family (a vitdense.ColumnarBackbone '
                            f'config or module), got {type(backbone).__name__}')
        if not backbone.dense or backbone.pyramid is not None:
            raise ValueError(f"the adapter reads the trunk's blocks itself: build "
                             f"{type(backbone).__name__} with out_type='featmap' and "
                             f"pyramid=False")
        if backbone.output_cls_token:
            raise ValueError("the adapter's levels are maps only: build "
                             f"{type(backbone).__name__} without output_cls_token")
        return backbone

    def _check_groups(self, groups: Optional[Sequence[Sequence[int]]]
                      ) -> tuple[tuple[int, int], ...]:
        num_layers = self.trunk.num_layers
        if groups is None:
            return default_interaction_indexes(num_layers)
        checked = tuple((int(group[0]), int(group[-1])) for group in groups)
        expected_first = 0
        for first, last in checked:
            if first != expected_first or last < first:
                raise ValueError(f'interaction_indexes must split blocks 0-{num_layers - 1} '
                                 f'into consecutive (first, last) groups, got '
                                 f'{[list(g) for g in groups]}')
            expected_first = last + 1
        if expected_first != num_layers:
            raise ValueError(f'interaction_indexes {[list(g) for g in groups]} end at block '
                             f'{expected_first - 1}, the trunk has {num_layers} blocks')
        return checked

    def _init_adapter(self) -> None:
        """The official init: truncated normal linears, He-normal (fan-out) convs, unit
        norms; deformable attention's own init; a normal level embedding."""
        for module in (self.spm, self.interactions, self.up):
            for layer in module.modules():
                if isinstance(layer, nn.Linear):
                    nn.init.trunc_normal_(layer.weight, std=.02)
                    nn.init.zeros_(layer.bias)
                elif isinstance(layer, (nn.LayerNorm, nn.modules.batchnorm._BatchNorm)):
                    nn.init.ones_(layer.weight)
                    nn.init.zeros_(layer.bias)
                elif isinstance(layer, (nn.Conv2d, nn.ConvTranspose2d)):
                    fan_out = layer.kernel_size[0] * layer.kernel_size[1] * layer.out_channels
                    nn.init.normal_(layer.weight, 0, (2.0 / (fan_out // layer.groups)) ** .5)
                    if layer.bias is not None:
                        nn.init.zeros_(layer.bias)
        for layer in self.interactions.modules():
            if hasattr(layer, 'reset_parameters') and hasattr(layer, 'sampling_offsets'):
                layer.reset_parameters()
        nn.init.normal_(self.level_embed)

    # ------------------------------------------------------------------ forward
    def _embed(self, image: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """The trunk's patch tokens with their position encoding, as its own forward."""
        trunk = self.trunk
        if trunk.padding == 'image':
            pad_h, pad_w = ((trunk.patch_size - size % trunk.patch_size) % trunk.patch_size
                            for size in image.shape[2:])
            image = F.pad(image, (0, pad_w, 0, pad_h))
        tokens, hw = trunk.patch_embed(image)
        if trunk.class_token_layer == 0:
            tokens = trunk._prepend_cls_token(tokens)
        if trunk.pos_embed is not None:
            tokens = trunk.pos_embed(tokens, hw)
        return trunk.pos_drop(tokens), hw

    def _run_group(self, tokens: torch.Tensor, patches: torch.Tensor, hw: tuple[int, int],
                   first: int, last: int) -> torch.Tensor:
        """Trunk blocks ``first``-``last`` on the injected ``patches`` behind the prefix
        tokens of ``tokens``; the class token joins where the family places it."""
        trunk = self.trunk
        tokens = torch.cat([tokens[:, :tokens.shape[1] - patches.shape[1]], patches], dim=1)
        for index in range(first, last + 1):
            if index and index == trunk.class_token_layer:
                tokens = trunk._prepend_cls_token(tokens)
            tokens = trunk.run_block(index, trunk.blocks[index], tokens, hw)
        return tokens

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.trunk._check_input(x)
        c1, c2, c3, c4 = self.spm(x)
        prior_maps = (c2, c3, c4)
        prior = torch.cat([c.flatten(2).transpose(1, 2) + embed for c, embed in
                           zip(prior_maps, self.level_embed)], dim=1)
        tokens, hw = self._embed(x)
        geometry = AdapterGeometry.of([c.shape[2:] for c in prior_maps], hw, x.device)
        num_patches = hw[0] * hw[1]
        trunk_tokens = []  # after each interaction
        for interaction, (first, last) in zip(self.interactions, self.interaction_indexes):
            def run_blocks(patches: torch.Tensor, first: int = first,
                           last: int = last) -> torch.Tensor:
                nonlocal tokens
                tokens = self._run_group(tokens, patches, hw, first, last)
                return tokens[:, tokens.shape[1] - num_patches:]
            _, prior = interaction(tokens[:, tokens.shape[1] - num_patches:], prior,
                                   run_blocks, geometry)
            trunk_tokens.append(tokens)

        batch, dims = x.shape[0], prior.shape[-1]
        levels = prior.split([h * w for h, w in geometry.prior_shapes], dim=1)
        # contiguous NCHW maps: torch's CPU BatchNorm backward is wrong for a batch of one
        # image given as a channels-last view of tokens (torch 2.14: gradcheck fails)
        c2, c3, c4 = (level.transpose(1, 2).reshape(batch, dims, h, w).contiguous()
                      for level, (h, w) in zip(levels, geometry.prior_shapes))
        # the stride-8 level upsampled can be a pixel larger than the stem's map: its first
        # rows and columns are gathered (a slice, a view whose size export cannot relate to
        # the input's, would fix the exported graph to the traced size)
        up = self.up(c2)
        rows, cols = (torch.arange(size, device=x.device) for size in c1.shape[2:])
        c1 = up.index_select(2, rows).index_select(3, cols) + c1
        outs = [c1, c2, c3, c4]
        if self.add_vit_feature:
            only_last = self.vit_features == 'last'
            trunk_maps = [tokens_to_map(sequence, hw).contiguous()
                          for sequence in (trunk_tokens[-1:] if only_last else trunk_tokens)]
            if only_last:
                trunk_maps *= len(outs)
            outs = [out + F.interpolate(trunk_map, size=out.shape[2:], mode='bilinear',
                                        align_corners=False)
                    for out, trunk_map in zip(outs, trunk_maps)]
        return tuple(norm(out) for norm, out in
                     zip((self.norm1, self.norm2, self.norm3, self.norm4), outs))

    # ------------------------------------------------------------------ optimisation
    def get_layer_depth(self, param_name: str, prefix: str = '') -> tuple[int, int]:
        """Layer-wise lr decay: the trunk's parameters take the trunk's layer ids, the
        adapter's (trained from scratch) the last, full-rate one (as the official
        ``LayerDecayOptimizerConstructor``)."""
        if param_name.startswith(prefix + 'trunk.'):
            return self.trunk.get_layer_depth(param_name, prefix + 'trunk.')
        num_ids = self.trunk.num_layers + 2
        return num_ids - 1, num_ids

    def no_weight_decay(self) -> set[str]:
        """The trunk's no-decay parameters and the level embedding (the official recipes'
        ``level_embed`` rule)."""
        return {'level_embed'} | {f'trunk.{name}' for name in self.trunk.no_weight_decay()}
