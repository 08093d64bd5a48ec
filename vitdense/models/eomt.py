"""EoMT, the encoder-only mask transformer (Kerssies et al., "Your ViT is Secretly an Image
Segmentation Model", CVPR 2025).

No decoder: ``num_queries`` learned queries join the token sequence before the backbone's
last ``num_blocks`` blocks, and a small mask module reads class logits from the queries and
mask logits from the queries against the patch tokens upscaled to stride 4 (§3.2). During
training, each of those blocks runs masked attention (a query attends only to the patches its
mask predicted by the previous block covers, §3.3), and the mask is switched off per query with
a probability that rises to one over training (mask annealing, §3.4), so inference is the plain
backbone. :func:`annealed_mask_probability` is that schedule; a hook of the runner sets it
(``vitdense.EoMTMaskAnnealingHook``).

The model drives a columnar backbone's blocks itself (:meth:`ColumnarBackbone.embed`,
:meth:`ColumnarBackbone.run_block`): the backbone's own weights, checkpoints and options are
used unchanged. Where attention is not token to token, a masked query gets what the block's
mixer gives it on the tokens it sees alone: XCiT's cross-covariance attention takes each
query's covariance over its patches (its local patch interaction leaves the queries out);
ConViT's queries join with its class token, after the gated positional blocks
(``docs/eomt.md``).
"""
import math
from typing import Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule

from vitdense.registry import MODELS
from .backbones.base import ColumnarBackbone
from .layers.attention import (CrossCovarianceAttention, GatedPositionalSelfAttention,
                               MultiheadSelfAttention)
from .layers.norm import LayerNorm2d

#: per-layer predictions: class logits (B, queries, classes + 1) per prediction point and
#: mask logits (B, queries, H/4, W/4), the last of each from the final block's output
Predictions = tuple[list[torch.Tensor], list[torch.Tensor]]


def annealed_mask_probability(iteration: float, start: float, end: float, power: float = 0.9,
                              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The probability that a block keeps its attention mask at ``iteration`` (or a
    fraction of a time budget): one before ``start``, zero from ``end`` on, a polynomial
    decay of ``power`` in between (EoMT §3.4; the official code uses its learning rate's
    poly power, 0.9). Computed in ``dtype`` as the official code computes it in its
    buffer's."""
    if iteration < start:
        return torch.ones((), dtype=dtype)
    if iteration >= end:
        return torch.zeros((), dtype=dtype)
    progress = torch.tensor((iteration - start) / (end - start), dtype=dtype)
    return (1.0 - progress).pow(power)


class Upscale2x(nn.Sequential):
    """One doubling of the patch map (EoMT §3.2): 2×2 transposed conv, GELU, depth-wise 3×3
    conv, LayerNorm over channels."""

    def __init__(self, dim: int) -> None:
        super().__init__(nn.ConvTranspose2d(dim, dim, kernel_size=2, stride=2), nn.GELU(),
                         nn.Conv2d(dim, dim, 3, padding=1, groups=dim, bias=False),
                         LayerNorm2d(dim, eps=1e-6))


@MODELS.register_module()
class EoMT(BaseModule):
    """EoMT on a columnar backbone.

    Args:
        backbone: the backbone or its config. It must keep its final norm, which the mask
            module reads through: build it with ``out_type='cls_token'`` (CaiT, XCiT:
            ``'avg_featmap'``, which builds no class-attention stage; the pooling is not
            used). Supported in the last ``num_blocks`` blocks: token attention (ViT,
            ConViT's plain blocks after its GPSA ones; CaiT's talking heads, through their
            written-out maps) without window attention or relative position biases, and
            XCiT's cross-covariance attention (``docs/eomt.md`` says how).
        num_classes: classes, without the "no object" class the class head adds.
        num_queries: learned queries (EoMT: 100 for ADE20k semantic, 200 for COCO).
        num_blocks: the last blocks the queries take part in (EoMT: 4 of ViT-L's 24).
        masked_attn: masked attention in those blocks, and a prediction from the output of
            every block before them (each trained by the loss as Mask2Former's decoder
            layers); False: queries attend freely and only the final prediction is made.
        decay_query_blocks: layer-wise lr decay reaches the last ``num_blocks`` blocks too
            (the official default); False: they train at the full rate, as the heads (the
            official ``llrd_l2_enabled=False`` of its DINOv3 recipes).
        init_cfg: mmengine initialisation; the backbone keeps its own ``init_cfg``.

    ``forward(images)`` returns :data:`Predictions`: a prediction before each of the last
    ``num_blocks`` blocks whose mask is in use (all of them in training with
    ``masked_attn``), then the final one. Images must be multiples of the patch size.
    """

    def __init__(self, backbone: Union[dict, ColumnarBackbone], num_classes: int,
                 num_queries: int = 100, num_blocks: int = 4, masked_attn: bool = True,
                 decay_query_blocks: bool = True,
                 init_cfg: Optional[Union[dict, list]] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.decay_query_blocks = decay_query_blocks
        self.backbone = MODELS.build(backbone) if isinstance(backbone, dict) else backbone
        self._check_backbone(self.backbone, num_blocks)
        dim = self.backbone.embed_dims
        self.num_queries, self.num_blocks, self.masked_attn = num_queries, num_blocks, masked_attn
        #: the probability that each of the last ``num_blocks`` blocks keeps its mask for a
        #: query (one: always; zero: never), set by :meth:`set_mask_probabilities`; saved
        #: with the weights, so a trained model loads with its masks annealed away
        self.register_buffer('mask_probabilities', torch.ones(num_blocks))
        # the same as Python numbers, which the forward branches on without reading a
        # tensor (no synchronisation, no graph break, and models on the meta device run)
        self._probabilities = [1.0] * num_blocks
        self.queries = nn.Embedding(num_queries, dim)
        self.class_head = nn.Linear(dim, num_classes + 1)
        self.mask_head = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim),
                                       nn.GELU(), nn.Linear(dim, dim))
        # to stride 4: log2(patch size) - 2 doublings, at least one (EoMT §3.2)
        num_upscale = max(1, int(math.log2(self.backbone.patch_size)) - 2)
        self.upscale = nn.Sequential(*(Upscale2x(dim) for _ in range(num_upscale)))

    def set_mask_probabilities(self, probabilities: Sequence[float]) -> None:
        """Set the probability that each masked block keeps its mask (as float32)."""
        if len(probabilities) != self.num_blocks:
            raise ValueError(f'EoMT masks {self.num_blocks} blocks: give one probability each, '
                             f'got {len(probabilities)}')
        values = torch.tensor([float(p) for p in probabilities], dtype=torch.float32)
        self.mask_probabilities.copy_(values)
        self._probabilities = values.tolist()

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args, **kwargs) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        loaded = state_dict.get(f'{prefix}mask_probabilities')
        if loaded is not None and not loaded.is_meta:
            self._probabilities = loaded.float().tolist()

    @staticmethod
    def _check_backbone(backbone: nn.Module, num_blocks: int) -> None:
        name = type(backbone).__name__
        if not isinstance(backbone, ColumnarBackbone):
            raise TypeError(f'EoMT runs the blocks of a columnar backbone; got {name}')
        if not isinstance(getattr(backbone, 'norm', None), nn.LayerNorm):
            raise ValueError(f"EoMT reads its predictions through the backbone's final norm, "
                             f"which {name} builds only for classification: build it with "
                             f"out_type='cls_token' (CaiT, XCiT: 'avg_featmap', which builds no "
                             f"class-attention stage) and fc_norm=False")
        if not 1 <= num_blocks <= backbone.num_layers:
            raise ValueError(f'num_blocks must be between 1 and the {backbone.num_layers} '
                             f'blocks of {name}, got {num_blocks}')
        first = backbone.num_layers - num_blocks
        for index in range(first, backbone.num_layers):
            EoMT._check_block(backbone, index, num_blocks)
        if first < backbone.class_token_layer < backbone.num_layers:
            raise ValueError(f'the class token of {name} joins before block '
                             f'{backbone.class_token_layer}, after the queries (before block '
                             f'{first}): EoMT needs the prefix tokens in place before them; '
                             f'use num_blocks <= '
                             f'{backbone.num_layers - backbone.class_token_layer}')

    @staticmethod
    def _check_block(backbone: ColumnarBackbone, index: int, num_blocks: int) -> None:
        """Refuse block ``index`` if queries cannot take part in it, naming the fix."""
        name, block = type(backbone).__name__, backbone.blocks[index]
        if isinstance(block.attn, GatedPositionalSelfAttention):
            plain = backbone.num_layers - backbone.class_token_layer
            raise ValueError(f'block {index} of {name} has gated positional self-attention, '
                             f'whose positional term exists between patches only: EoMT\'s '
                             f'queries join where the class token does, in the {plain} plain '
                             f'self-attention blocks after the first num_local_layers='
                             f'{backbone.class_token_layer}; use num_blocks <= {plain} or '
                             f'fewer GPSA blocks (num_local_layers)')
        if isinstance(block.attn, MultiheadSelfAttention) and (
                block.attn.relative_position_bias is not None or
                block.attn.rel_pos is not None):
            raise ValueError(f'block {index} of {name} adds relative position biases, '
                             f'whose tables have rows for the patches (and a class token) '
                             f'only: EoMT\'s queries have no position; use a backbone '
                             f'without use_rel_pos_bias / use_rel_pos')
        mixers = (MultiheadSelfAttention, CrossCovarianceAttention)
        if not isinstance(block.attn, mixers) or block.window_size:
            raise ValueError(f'EoMT needs global token attention or XCA in the last '
                             f'{num_blocks} blocks of {name}; block {index} has '
                             f'{type(block.attn).__name__}'
                             f'{" in windows" if block.window_size else ""}')

    def _predict(self, tokens: torch.Tensor, num_prefix: int,
                 hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Class and mask logits of the queries in ``tokens`` (queries, prefix, patches),
        read through the backbone's final norm."""
        tokens = self.backbone.norm(tokens)
        queries = tokens[:, :self.num_queries]
        patches = tokens[:, self.num_queries + num_prefix:]
        patches = patches.transpose(1, 2).reshape(tokens.shape[0], -1, *hw)
        mask_logits = torch.einsum('bqc,bchw->bqhw', self.mask_head(queries),
                                   self.upscale(patches))
        return self.class_head(queries), mask_logits

    def _attention_mask(self, mask_logits: torch.Tensor, num_prefix: int, hw: tuple[int, int],
                        probability: float) -> torch.Tensor:
        """(B, queries, N), the rows of the queries (the first tokens; the others attend
        to every token): each query attends to every token but the patches outside its
        predicted mask (logits at the patch grid > 0); a query keeps that mask with
        ``probability`` (EoMT §3.3-3.4)."""
        batch, num_tokens = mask_logits.shape[0], self.num_queries + num_prefix + hw[0] * hw[1]
        mask = torch.ones(batch, self.num_queries, num_tokens, dtype=torch.bool,
                          device=mask_logits.device)
        covered = F.interpolate(mask_logits, hw, mode='bilinear').flatten(2) > 0
        to_patches = mask[:, :, self.num_queries + num_prefix:]
        to_patches.copy_(covered)
        if probability < 1:
            dropped = torch.rand(batch, self.num_queries, device=mask.device) > probability
            to_patches[dropped] = True
        return mask

    def forward(self, images: torch.Tensor) -> Predictions:
        backbone = self.backbone
        if images.shape[-2] % backbone.patch_size or images.shape[-1] % backbone.patch_size:
            raise ValueError(f'EoMT needs images whose sides are multiples of the patch size '
                             f'{backbone.patch_size}, got {tuple(images.shape[-2:])}: pad or '
                             f'crop them to such a size (mmseg: the data preprocessor\'s '
                             f'size or size_divisor)')
        tokens, hw = backbone.embed(images)
        first = backbone.num_layers - self.num_blocks
        class_logits, mask_logits = [], []
        for index, block in enumerate(backbone.blocks):
            attn_mask = None
            tokens = backbone.join_class_token(index, tokens)
            if index == first:
                num_prefix = tokens.shape[1] - hw[0] * hw[1]
                queries = self.queries.weight.expand(tokens.shape[0], -1, -1)
                tokens = torch.cat([queries, tokens], dim=1)
            if index >= first and self.masked_attn:
                probability = self._probabilities[index - first]
                if self.training or probability > 0:
                    classes, masks = self._predict(tokens, num_prefix, hw)
                    class_logits.append(classes)
                    mask_logits.append(masks)
                if probability > 0:
                    attn_mask = self._attention_mask(mask_logits[-1], num_prefix, hw,
                                                     probability)
            extra = {} if attn_mask is None else dict(attn_mask=attn_mask)
            tokens = backbone.run_block(index, block, tokens, hw, **extra)
        classes, masks = self._predict(tokens, num_prefix, hw)
        return class_logits + [classes], mask_logits + [masks]

    def get_layer_depth(self, param_name: str, prefix: str = '') -> tuple[int, int]:
        """Layer id for layer-wise lr decay as the official EoMT counts it: block i of L is
        layer i, the embeddings are layer 0 with the first block, the final norm, queries
        and mask module layer L - 1 (the full learning rate); so are the query blocks
        without ``decay_query_blocks``."""
        num_layers = self.backbone.num_layers
        inner = f'{prefix}backbone.'
        if not param_name.startswith(inner):
            return num_layers - 1, num_layers
        depth, _ = self.backbone.get_layer_depth(param_name, inner)
        layer = min(max(depth - 1, 0), num_layers - 1)
        if not self.decay_query_blocks and layer >= num_layers - self.num_blocks:
            return num_layers - 1, num_layers
        return layer, num_layers

    def no_weight_decay(self) -> set[str]:
        """The backbone's parameters trained without weight decay, by their names here."""
        return {f'backbone.{name}' for name in self.backbone.no_weight_decay()}
