"""ViT's checkpoint layout (:class:`ViTCheckpointLayout`, the ``checkpoint_layout`` of
``vit.ViT``): the keys and tensors of the sources ViT reads (timm, OpenMMLab, DINOv2 / v3,
EVA-02, CLIP, BEiT, SAM, DeiT III, detectron2's ViTDet), the layouts whose options no shape
shows, and the rules beyond tables: BEiT's tables and EVA-02's rotary tables fitted to the
model, DINOv3's untied class-token norm, learned rotary frequencies refused, res-post-norm
blocks told by the order of a file's keys (or, for a sorted file of timm's res-post-norm
tensors, chosen). DeiT III's parallel blocks: ``checkpoint_parallel``.
"""
import math
import re
from dataclasses import dataclass
from typing import Collection, Optional

import torch
import torch.nn as nn
from mmengine.logging import MMLogger
from timm.layers import resample_patch_embed

from ..layers.embed import PositionKernel
from ..layers.relative_bias import RelativePositionBias
from ..layers.rotary import RotaryPositionEmbedding
from ..layers.swiglu import merge_swiglu_tensors
from .checkpoint_keys import Alias, KeyTable, TensorRule
from .checkpoint_layout import CheckpointLayout, checkpoint_weights
from .checkpoint_parallel import (name_official_parallel_branches, split_parallel_branches,
                                  stack_parallel_branches)

#: timm's EVA attention keeps q and v biases beside a bias-free fused qkv (``q_bias``,
#: ``v_bias``) or three maps (``q_proj``, ``k_proj`` without bias, ``v_proj``)
EVA_QV_BIAS = re.compile(r'^(blocks\.\d+\.attn)\.q_bias$')
EVA_SPLIT_QKV = re.compile(r'^(blocks\.\d+\.attn)\.q_proj\.weight$')
BLOCK = re.compile(r'^blocks\.(\d+)\.')
#: EVA-02's rotary tables as saved against ours: cosines and sines of the same angles,
#: computed in float32 in another order of operations
ROTARY_TABLE_TOLERANCE = 1e-5
#: detectron2's ViTDet detector keys (``ViT`` in ``backbone.net``, ``SimpleFeaturePyramid``
#: stages ``backbone.simfp_<log2 stride>.<index>``) -> ours (``backbone.`` ViT built with
#: ``dense_class_token=False``, ``neck.`` :class:`SimpleFeaturePyramid`)
DETECTRON2_VITDET_KEYS = KeyTable(keys=(
    Alias('^backbone.net.pos_embed$', '^backbone.pos_embed.weight$'),
    Alias('^backbone.net.', '^backbone.'),
    Alias('.attn.rel_pos_h$', '.attn.rel_pos.height$'),
    Alias('.attn.rel_pos_w$', '.attn.rel_pos.width$'),
    # stride 4: transposed conv, LayerNorm, GELU, transposed conv, then the two convs
    Alias('^backbone.simfp_2.{i:0|1|3}.', '^neck.rescales.0.{i}.'),
    Alias('^backbone.simfp_2.4.', '^neck.lateral_convs.0.'),
    Alias('^backbone.simfp_2.5.', '^neck.fpn_convs.0.'),
    # stride 8: transposed conv, then the two convs
    Alias('^backbone.simfp_3.0.', '^neck.rescales.1.0.'),
    Alias('^backbone.simfp_3.1.', '^neck.lateral_convs.1.'),
    Alias('^backbone.simfp_3.2.', '^neck.fpn_convs.1.'),
    # stride 16: the two convs; stride 32: max pooling, then the two convs
    Alias('^backbone.simfp_4.0.', '^neck.lateral_convs.2.'),
    Alias('^backbone.simfp_4.1.', '^neck.fpn_convs.2.'),
    Alias('^backbone.simfp_5.1.', '^neck.lateral_convs.3.'),
    Alias('^backbone.simfp_5.2.', '^neck.fpn_convs.3.'),
    # detectron2's Conv2d holds its norm; ours is conv + norm
    Alias('^neck.{kind:lateral|fpn}_convs.{i}.weight$', '^neck.{kind}_convs.{i}.conv.weight$'),
))
#: OpenMMLab's ViT keys (mmpretrain ``VisionTransformer`` / ``DeiT3``, mmseg
#: ``VisionTransformer``) -> ours; mmseg's attention is torch's ``nn.MultiheadAttention``
#: (``in_proj`` holds q, k, v stacked as our ``qkv``); mmpretrain's ``ln2`` is the norm after
#: average pooling (``out_type='avg_featmap'``: MAE's fine-tuned layout), our ``fc_norm``
OPENMMLAB_VIT_KEYS: tuple[Alias, ...] = (
    Alias('^layers.', '^blocks.'),
    Alias('^ln1.', '^norm.'),
    Alias('^ln2.', '^fc_norm.'),
    Alias('^blocks.{i}.ln{n:1|2}.', '^blocks.{i}.norm{n}.'),
    Alias('^patch_embed.projection.', '^patch_embed.proj.'),
    Alias('.attn.attn.in_proj_{param:weight|bias}$', '.attn.qkv.{param}$'),
    Alias('.attn.attn.out_proj.', '.attn.proj.'),
    Alias('.attn.gamma1.weight$', '.ls1.gamma$'),
    Alias('.ffn.gamma2.weight$', '.ls2.gamma$'),
)
#: OpenAI's CLIP state dict (``visual.``: ``conv1`` without bias, ``class_embedding`` and
#: ``positional_embedding`` without their batch axis, ``ln_pre`` / ``ln_post``, residual
#: blocks of torch's ``nn.MultiheadAttention`` and ``c_fc`` / ``c_proj``) -> ours; its
#: image projection and text tower are left out (``OPENAI_CLIP_ONLY_KEYS``)
OPENAI_CLIP_KEYS: tuple[Alias, ...] = (
    Alias('^visual.conv1.', '^patch_embed.proj.'),
    Alias('^visual.class_embedding$', '^cls_token$'),
    Alias('^visual.positional_embedding$', '^pos_embed.weight$'),
    Alias('^visual.ln_pre.', '^norm_pre.'),
    Alias('^visual.ln_post.', '^norm.'),
    Alias('^visual.transformer.resblocks.', '^blocks.'),
    Alias('^blocks.{i}.ln_{n:1|2}.', '^blocks.{i}.norm{n}.'),
    Alias('^blocks.{i}.attn.in_proj_{param:weight|bias}$', '^blocks.{i}.attn.qkv.{param}$'),
    Alias('^blocks.{i}.attn.out_proj.', '^blocks.{i}.attn.proj.'),
    Alias('^blocks.{i}.mlp.c_fc.', '^blocks.{i}.mlp.fc1.'),
    Alias('^blocks.{i}.mlp.c_proj.', '^blocks.{i}.mlp.fc2.'),
)
#: OpenAI's CLIP tensors outside the image trunk: the image projection and the text tower
OPENAI_CLIP_ONLY_KEYS = (r'^(visual\.proj|transformer\.|token_embedding\.|positional_embedding|'
                         r'ln_final\.|text_projection|logit_scale)')
#: the official layouts of the ViT sources timm converts -> ours: DINOv3's hub files
#: (storage tokens), DeiT-distilled's distillation token (a register with a position row:
#: ``reg_tokens=1``), SAM's image encoder (``image_encoder.``, ``mlp.lin1``, relative position
#: tables), DINOv2-g's fused SwiGLU (``w12``, ``w3``), EVA-02's releases (SwiGLU ``w1``,
#: ``w2``, ``w3``, its ``ffn_ln``); DINOv2's registers are merged (``VIT_KEYS``)
SOURCE_KEYS: tuple[Alias, ...] = (
    Alias('^storage_tokens$', '^reg_token$'),
    Alias('^dist_token$', '^reg_token$'),
    Alias('^image_encoder.pos_embed$', '^pos_embed.weight$'),
    Alias('^image_encoder.', '^'),
    Alias('.mlp.lin{n:1|2}.', '.mlp.fc{n}.'),
    Alias('.mlp.w12.', '.mlp.fc1.'),
    Alias('.mlp.w1.', '.mlp.fc1_g.'),
    Alias('.mlp.w2.', '.mlp.fc1_x.'),
    Alias('.mlp.w3.', '.mlp.fc2.'),
    Alias('.mlp.ffn_ln.', '.mlp.norm.'),
    Alias('.attn.rel_pos_h$', '.attn.rel_pos.height$'),
    Alias('.attn.rel_pos_w$', '.attn.rel_pos.width$'),
    Alias('.attn.relative_position_bias_table$', '.attn.relative_position_bias.table$'),
) + OPENAI_CLIP_KEYS
#: BEiT's pretraining checkpoints: one relative position table shared by all blocks, which
#: fine-tuning gives each block a copy of (BEiT §2.6)
SHARED_RELATIVE_TABLE = 'rel_pos_bias.relative_position_bias_table'
#: tensors of the sources' pretraining or other tasks that ViT has no module for, left out
#: with a log line naming them (as timm does): DINOv2's and DINOv3's mask token, DINOv3's
#: rotary periods (recomputed) and key-bias mask (applied first), SAM's neck and its prompt
#: encoder and mask decoder, BEiT's relative position indices (recomputed), EVA-02's
#: masked-image-modelling head, BEiT v2's pretraining head on the class token (its
#: ``cls_pt_layers`` blocks, norms and head: the backbone's blocks do not feed them), DINOv3
#: L SAT-493M's and 7B's norm of the local crops' class tokens (used in training only)
SOURCE_ONLY_KEYS = (r'^(mask_token|rope_embed\.periods|lm_head\.|neck\.|prompt_encoder\.|'
                    r'mask_decoder\.|cls_pt_|local_cls_norm\.)|\.qkv\.bias_mask$|'
                    r'relative_position_index$')
#: DINOv3's norm of the class and storage tokens where it is not the patches' (untied)
UNTIED_CLASS_NORM = 'cls_norm.'
#: learned rotary frequencies (the rope-mixed ViTs: timm's ``rope.freqs``, Naver's ``freqs``)
LEARNED_ROTARY = re.compile(r'^(rope\.)?freqs$')
#: the first block's norm and attention as saved in timm's layout (their order shows where
#: the block normalises)
BLOCK_MODULE_AS_SAVED = re.compile(r'^blocks\.0\.(norm1|attn)\.')
#: the first block's tensors (our layout) in timm's res-post-norm release (``vit_*_rpn_*``:
#: no qkv bias, LayerScale or other norms), which a pre-norm block of the same options has too
RES_POST_NORM_BLOCK = frozenset((
    'attn.qkv.weight', 'attn.proj.weight', 'attn.proj.bias', 'norm1.weight', 'norm1.bias',
    'mlp.fc1.weight', 'mlp.fc1.bias', 'mlp.fc2.weight', 'mlp.fc2.bias', 'norm2.weight',
    'norm2.bias'))
#: EVA-02's rotary tables, which its official code keeps as buffers, once for the model and
#: once in every block: checked against what the model computes, then dropped
EVA_ROTARY_TABLE = re.compile(r'^(|blocks\.\d+\.attn\.)rope\.freqs_(cos|sin)$')


def merge_eva_attention(state_dict: dict) -> dict:
    """timm's EVA attention as our ``qkv``: its separate q, k, v maps stacked, and its q and
    v biases with the key's zero bias between them."""
    for key in [k for k in state_dict if EVA_SPLIT_QKV.match(k)]:
        attn = EVA_SPLIT_QKV.match(key).group(1)
        state_dict[f'{attn}.qkv.weight'] = torch.cat(
            [state_dict.pop(f'{attn}.{name}_proj.weight') for name in 'qkv'])
        if f'{attn}.q_proj.bias' in state_dict:
            state_dict[f'{attn}.q_bias'] = state_dict.pop(f'{attn}.q_proj.bias')
            state_dict[f'{attn}.v_bias'] = state_dict.pop(f'{attn}.v_proj.bias')
    for key in [k for k in state_dict if EVA_QV_BIAS.match(k)]:
        attn, q_bias = EVA_QV_BIAS.match(key).group(1), state_dict.pop(key)
        state_dict[f'{attn}.qkv.bias'] = torch.cat(
            [q_bias, torch.zeros_like(q_bias), state_dict.pop(f'{attn}.v_bias')])
    return state_dict


def apply_key_bias_mask(state_dict: dict) -> dict:
    """DINOv3's hub files: the key bias masked out (to zero) as their forward does."""
    for key in [k for k in state_dict if k.endswith('.qkv.bias_mask')]:
        bias = key[:-len('_mask')]
        state_dict[bias] = state_dict[bias] * torch.nan_to_num(state_dict[key])
    return state_dict


def copy_shared_relative_table(state_dict: dict) -> dict:
    """BEiT's pretraining checkpoints: the shared relative position table copied to each
    block (BEiT §2.6)."""
    if SHARED_RELATIVE_TABLE in state_dict:
        shared = state_dict.pop(SHARED_RELATIVE_TABLE)
        for block in sorted({int(m.group(1)) for m in map(BLOCK.match, state_dict) if m}):
            state_dict[f'blocks.{block}.attn.relative_position_bias.table'] = shared.clone()
    return state_dict


def merge_hub_registers(state_dict: dict) -> dict:
    """DINOv2's hub files position the class token, not the registers: as timm, the class
    token's row joins the token and the registers join without positions
    (``no_embed_class=True``)."""
    if 'register_tokens' in state_dict:
        table = state_dict['pos_embed.weight']
        state_dict['reg_token'] = state_dict.pop('register_tokens')
        state_dict['cls_token'] = state_dict['cls_token'] + table[:, :1]
        state_dict['pos_embed.weight'] = table[:, 1:]
    return state_dict


def flatten_position_grid(state_dict: dict) -> dict:
    """SAM's position table, (1, rows, cols, C), as our (1, rows * cols, C)."""
    table = state_dict.get('pos_embed.weight')
    if table is not None and table.dim() == 4:
        state_dict['pos_embed.weight'] = table.flatten(1, 2)
    return state_dict


def add_batch_axes(state_dict: dict) -> dict:
    """A class token (C) and a position table (N, C) saved without their batch axis
    (OpenAI's CLIP) with it, as ours."""
    for key, dims in (('cls_token', 1), ('pos_embed.weight', 2)):
        value = state_dict.get(key)
        if value is not None and value.dim() == dims:
            state_dict[key] = value.reshape(1, -1, value.shape[-1])
    return state_dict


def add_zero_patch_bias(state_dict: dict) -> dict:
    """A patch projection saved without bias (mmseg's ``patch_bias=False``) with the zero
    bias that computes the same."""
    weight = state_dict.get('patch_embed.proj.weight')
    if weight is not None and 'patch_embed.proj.bias' not in state_dict:
        state_dict['patch_embed.proj.bias'] = weight.new_zeros(weight.shape[0])
    return state_dict


def convert_detectron2_vitdet(state_dict: dict) -> dict:
    """The ViT backbone and simple feature pyramid of a detectron2 ViTDet state dict in our
    layout (``backbone.*``, ``neck.*``); other tensors (its RPN and RoI heads) are left out."""
    converted = {DETECTRON2_VITDET_KEYS.key_to_ours(key): value
                 for key, value in state_dict.items()}
    return {key: value for key, value in converted.items()
            if key.startswith(('backbone.', 'neck.'))}



#: timm's ViT keys are ours (its bare position table: the shared table's); the sources'
#: layouts are read on load. The sources' tensors stored otherwise are merged, each
#: stored by timm's VisionTransformer as ours or refused by the export
#: (``timm_inexpressible``), but for parallel blocks, split back into timm's branches
VIT_KEYS = KeyTable(
    keys=OPENMMLAB_VIT_KEYS + SOURCE_KEYS,
    tensors=(TensorRule(merge_swiglu_tensors, to_timm=None),
             TensorRule(merge_eva_attention, to_timm=None),
             TensorRule(apply_key_bias_mask, to_timm=None),
             TensorRule(copy_shared_relative_table, to_timm=None),
             TensorRule(merge_hub_registers, to_timm=None),
             TensorRule(flatten_position_grid, to_timm=None),
             TensorRule(add_batch_axes, to_timm=None),
             TensorRule(add_zero_patch_bias, to_timm=None),
             TensorRule(name_official_parallel_branches, to_timm=None),
             TensorRule(stack_parallel_branches, split_parallel_branches)),
    left_out=f'{SOURCE_ONLY_KEYS}|{OPENAI_CLIP_ONLY_KEYS}')



@dataclass(frozen=True)
class ViTCheckpointLayout(CheckpointLayout):
    """ViT's checkpoints: the tables above, and the rules beyond them."""

    def weights(self, checkpoint: dict) -> dict:
        """As the base's, for a file wrapped in ``module`` too (EVA-02's releases)."""
        if isinstance(checkpoint.get('module'), dict):
            checkpoint = checkpoint['module']
        return checkpoint_weights(checkpoint)

    def fit_tensors(self, model: nn.Module, converted: dict) -> dict:
        """BEiT's relative position tables of another grid resampled to the model's, as BEiT
        does (their modules' load hook does the same for our own layout); with
        ``resample_patch_embed`` the patch projection resampled to ``patch_size``."""
        kernel, size = converted.get('patch_embed.proj.weight'), model.patch_size
        if model.arch['resample_patch_embed'] and kernel is not None and \
                kernel.shape[-2:] != (size, size):
            MMLogger.get_current_instance().info(
                f'{self.family}: patch projection of {tuple(kernel.shape[-2:])} kernels '
                f'resampled to {size} (resample_patch_embed=True)')
            converted['patch_embed.proj.weight'] = resample_patch_embed(kernel, [size, size])
        for name, module in model.named_modules():
            if isinstance(module, RelativePositionBias) and f'{name}.table' in converted:
                converted[f'{name}.table'] = module.checkpoint_table(converted[f'{name}.table'])
        return self._take_class_token_norm(
            model, self._drop_computed_rotary_tables(model, converted))

    def _take_class_token_norm(self, model: nn.Module, converted: dict) -> dict:
        """DINOv3 L SAT-493M and 7B normalise the class and storage tokens by a norm of
        their own (``cls_norm``) and the patches by ``norm``: a model reading the class token
        takes ``cls_norm`` as its final norm; one reading the patches keeps ``norm`` and
        leaves ``cls_norm`` unused, logged."""
        untied = {key: converted.pop(key) for key in list(converted)
                  if key.startswith(UNTIED_CLASS_NORM)}
        if not untied:
            return converted
        reads_class_token = model.out_type == 'cls_token' and not model.fc_norm_after_pooling
        if reads_class_token:
            converted.update({'norm.' + key[len(UNTIED_CLASS_NORM):]: value
                              for key, value in untied.items()})
        read = ('the class token is read, normalised by cls_norm' if reads_class_token
                else 'the patches are read: cls_norm is unused')
        MMLogger.get_current_instance().info(
            f'{self.family}: the checkpoint normalises its class token by cls_norm and its '
            f'patches by norm (untied norms); {read}')
        return converted

    def _drop_computed_rotary_tables(self, model: nn.Module, converted: dict) -> dict:
        """EVA-02's rotary tables (``EVA_ROTARY_TABLE``) dropped, with a log line, where
        the model's rotary embedding computes each of them (within float rounding); else
        kept, so that the load is refused and the advice names the reference grid they are
        built for (``ref_feat_shape``)."""
        tables = {key: value for key, value in converted.items() if EVA_ROTARY_TABLE.match(key)}
        rope = next((m for m in model.modules() if isinstance(m, RotaryPositionEmbedding)),
                    None)
        if not tables or rope is None or rope.style != 'eva02':
            return converted
        for key, table in tables.items():
            rows, dims = table.shape[-2:]
            side = math.isqrt(rows)
            if table.dim() != 2 or side * side != rows or dims != rope.head_dim:
                return converted
            angles = rope.angles((side, side), table.device)
            computed = angles.cos() if key.endswith('cos') else angles.sin()
            if (table.float() - computed).abs().max() > ROTARY_TABLE_TOLERANCE:
                return converted
        for key in tables:
            del converted[key]
        MMLogger.get_current_instance().info(
            f'{self.family}: the checkpoint\'s {len(tables)} rotary tables (EVA-02\'s buffers: '
            f'{", ".join(sorted(tables)[:3])}, ...) are what this model computes (reference '
            f'grid {rope.ref_grid}): dropped')
        return converted

    def mechanisms_not_built(self, saved_keys: list[str]) -> list[str]:
        """Learned rotary frequencies (``rope.freqs``, ``freqs``: timm's and Naver's
        rope-mixed ViTs, Heo et al. 2024)."""
        if any(LEARNED_ROTARY.match(key) for key in saved_keys):
            return ['learned rotary frequencies (rope.freqs: the rope-mixed ViTs)']
        return []

    @staticmethod
    def saved_post_norm(saved_keys: list[str]) -> Optional[bool]:
        """Whether the first block's keys as saved put ``attn`` before ``norm1`` (timm's
        ``ResPostBlock`` and ours do, pre-norm blocks save ``norm1`` first); None where the
        keys show no order (sorted, as safetensors writes them)."""
        first: dict[str, int] = {}
        for index, key in enumerate(saved_keys):
            match = BLOCK_MODULE_AS_SAVED.match(key)
            if match:
                first.setdefault(match.group(1), index)
        if saved_keys == sorted(saved_keys) or len(first) < 2:
            return None
        return first['attn'] < first['norm1']

    def order_options(self, model: nn.Module, saved_keys: list[str]) -> list[str]:
        """``res_post_norm`` as the order of the first block's keys shows it, where the
        model's differs."""
        post_norm = self.saved_post_norm(saved_keys)
        if post_norm is None or post_norm == model.arch['res_post_norm']:
            return []
        return [f'res_post_norm={post_norm} (the file\'s blocks normalise the '
                f'{"outputs" if post_norm else "inputs"} of attention and FFN: its keys put '
                f'{"attn before norm1" if post_norm else "norm1 before attn"})']

    def unchosen_options(self, model: nn.Module, saved_keys: list[str], converted: dict
                         ) -> list[str]:
        """As the base's, and ``res_post_norm`` for a model not given it and a file whose
        keys show no order but whose tensors are those of timm's res-post-norm release: no
        class token and a first block of exactly ``RES_POST_NORM_BLOCK``'s tensors, which
        either block kind loads. Files of other tensors come from sources of pre-norm
        blocks only, and load as such."""
        advice = super().unchosen_options(model, saved_keys, converted)
        block = {key[len('blocks.0.'):] for key in converted if key.startswith('blocks.0.')}
        if self.saved_post_norm(saved_keys) is not None or 'cls_token' in converted or \
                block != RES_POST_NORM_BLOCK or self.chosen(model, 'res_post_norm'):
            return advice
        return ['res_post_norm=True or res_post_norm=False (whether the blocks normalise the '
                'outputs or the inputs of attention and FFN, which neither the tensors nor '
                'their sorted keys show: timm\'s vit_*_rpn_* files, which have these tensors, '
                'normalise outputs: set the file\'s)'] + advice

    def family_options(self, model: nn.Module, found: dict) -> list[str]:
        """EVA-02's rotary reference grid where the checkpoint's rotary tables show another
        than the model's (or, with ``rope`` advised, would have)."""
        grid = found['rotary_grid']
        if grid and grid != tuple(model.arch['ref_feat_shape'] or model.pretrain_grid):
            return [f"ref_feat_shape={grid} (the reference grid of the checkpoint's EVA-02 "
                    f"rotary tables)"]
        return []

    def built_by_other_modes(self, model: nn.Module, key: str, checkpoint: Collection[str]
                             ) -> bool:
        """As the base's, except for registers: kept by a model without class token, and
        dropped only with the class token they follow (those of a file without one,
        timm's ``*_reg4_gap``, are read by every block: a trunk without them computes
        something else, so the load is refused)."""
        if key == 'reg_token' and (model.reg_token is not None or 'cls_token' not in checkpoint):
            return False
        return super().built_by_other_modes(model, key, checkpoint)


#: the layout of ViT's checkpoints (``ViT.checkpoint_layout``)
VIT_CHECKPOINT_LAYOUT = ViTCheckpointLayout(
    'ViT',
    keys=VIT_KEYS,
    markers=(r'^blocks\.\d+\.attn\.qkv\.',),
    # the sources' layouts as saved, named by a refused load's advice: their rotary
    # positions, relative bias and norms (the shapes show SwiGLU and the registers)
    source_layouts=(
        (r'relative_position_bias_table$', None, dict(use_rel_pos_bias=True, pos_embed='none'),
         "BEiT's relative position bias"),
        (r'\.attn\.(q_bias|q_proj\.weight)$', r'relative_position_bias_table$',
         dict(rope='eva02'), "EVA-02's rotary positions, which no tensor shows"),
        (r'^patch_embed\.', r'^(image_encoder\.)?pos_embed|relative_position_bias_table$',
         dict(pos_embed='none', rope='dinov3', norm_eps=1e-5),
         "DINOv3's rotary positions, its only ones"),
        (r'^(norm_pre|visual\.ln_pre)\.', None, dict(pre_norm=True, norm_eps=1e-5),
         "CLIP's norm before the blocks: OpenAI's weights take act_layer='quick_gelu' too, "
         "which no tensor shows"),
        (r'\.attn\.q_norm\.', None, dict(qk_norm=True), 'norms of the queries and keys'),
        (r'\.mlp\.(norm|ffn_ln)\.', None, dict(scale_mlp=True),
         "EVA-02's norm of the SwiGLU hidden units"),
    ),
    # mmseg's ViT (torch's MultiheadAttention) normalises with its config's LayerNorm eps:
    # 1e-6 in its UperNet, SETR and Segmenter configs, its class default 1e-5 in DPT's and
    # SAN's; mmpretrain's ViT and DeiT III take 1e-6, ours
    unshown_options=(
        (r'^layers\.\d+\.attn\.attn\.in_proj_weight$', 'norm_eps',
         "norm_eps=1e-06 or norm_eps=1e-05 (mmseg's LayerNorm eps, which no tensor shows: "
         "1e-6 in its UperNet, SETR and Segmenter configs, 1e-5, its default, in DPT's: "
         "set the file's config's)"),
    ),
    # mmpretrain's ``resize_pos_embed`` and mmseg's ``resize_pos_embed`` (at load and in
    # forward): ``F.interpolate`` bicubic without antialiasing; DINOv2's hub models
    # (``interpolate_pos_encoding``): without registers (a ``mask_token``, LayerScale, the
    # class row in the table), plain bicubic with the scale factor offset by 0.1; with
    # registers, antialiased without offset, as timm
    position_kernels=(
        ((r'^layers\.\d+\.',), None, PositionKernel(antialias=False)),
        ((r'^mask_token$', r'^blocks\.\d+\.ls1\.gamma$', r'^pos_embed$'), r'^register_tokens$',
         PositionKernel(antialias=False, offset=.1)),
    ),
    timm_arguments=dict(layer_scale='init_values', no_embed_class='no_embed_class',
                        reg_tokens='reg_tokens', class_token='class_token', qk_norm='qk_norm',
                        act_layer='act_layer', pre_norm='pre_norm',
                        fc_norm_after_pooling='fc_norm'),
    # timm's VisionTransformer has no rotary positions, SwiGLU or relative position bias
    # (its Eva and Beit classes do, in layouts of their own), and builds res-post-norm
    # blocks from a block class (``block_fn``), which no keyword names
    timm_inexpressible=dict(rope=None, swiglu_mlp=False, use_rel_pos_bias=False,
                            res_post_norm=False),
    # SigLIP's attention-pooling head (``attn_pool``) belongs to the classification stage
    classification_keys=r'^(norm|fc_norm|cls_blocks|attn_pool)\.',
)
